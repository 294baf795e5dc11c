"""Loop detection in the real call path: warn in the result text, block before dispatch, abort runs."""

from __future__ import annotations

import json

import pytest

from tests.harness import GatewayOn, Proc
from workers import ToolCall, ToolGateway
from workers.errors import CompactionLoopPersisted

LOOPS = {"enabled": True, "historySize": 30, "warningThreshold": 3, "criticalThreshold": 5}


@pytest.fixture
def loop_gateway(env: dict[str, str], gateway_on: GatewayOn) -> ToolGateway:
    return gateway_on({**env, "UNSTUCK_TOOLS__LOOP_DETECTION": json.dumps(LOOPS)})


@pytest.mark.timeout(90)
def test_identical_failing_call_is_warned_then_blocked_before_reaching_a_worker(
    worker: Proc, loop_gateway: ToolGateway
) -> None:
    # Given an agent that repeats the same failing call
    results = []
    for i in range(1, 7):
        call = ToolCall(id=f"c{i}", name="boom", arguments={"message": "disk full"})
        results.extend(loop_gateway.call_tools(session_key="loop", run_id="r1", calls=[call]))
    # Then calls with fewer identical predecessors than the warning threshold run plainly
    assert [r.reason for r in results[:3]] == ["tool_error"] * 3
    assert "loop warning" not in results[2].text
    # And from the warning threshold on, the warning is in the text the model sees
    assert results[3].reason == "tool_error"
    assert "[unstuck loop warning]" in results[3].text
    assert results[3].details["loop_warning"]["count"] == 3
    # And at the critical threshold the call is refused with the detector and count
    blocked = results[5]
    assert blocked.reason == "loop_blocked"
    assert blocked.details["detector"] == "generic_repeat"
    assert blocked.details["count"] == 5
    # And a blocked call never reached a worker
    ledger = loop_gateway._rt.ledger
    record = ledger.record(ledger.keys("loop", "r1"), "c6")
    assert record is not None
    assert "task_id" not in record.fields
    assert "c6#" not in worker.log()
    assert "c5#" in worker.log()


@pytest.mark.timeout(90)
def test_loop_that_survives_compaction_aborts_the_run(worker: Proc, loop_gateway: ToolGateway) -> None:
    # Given a run that compacted its context
    assert loop_gateway.note_compaction("compact", "r1")
    call_args = {"text": "same"}

    # When the same call with the same result repeats for the guard's window
    def repeat_until_aborted() -> None:
        for i in range(1, 10):
            call = ToolCall(id=f"k{i}", name="echo", arguments=call_args)
            loop_gateway.call_tools(session_key="compact", run_id="r1", calls=[call])

    with pytest.raises(CompactionLoopPersisted) as caught:
        repeat_until_aborted()
    # Then the gateway raised a typed error carrying the detector and count, with the results
    assert caught.value.detector == "compaction_loop_persisted"
    assert caught.value.count >= 3
    assert len(caught.value.results) == 1
    # And the run stays aborted: later calls are answered without running
    with pytest.raises(CompactionLoopPersisted) as again:
        loop_gateway.call_tools(
            session_key="compact", run_id="r1", calls=[ToolCall(id="late", name="echo", arguments=call_args)]
        )
    assert again.value.results[0].reason == "run_aborted"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "call",
    [
        ToolCall(id="x", name="echo", arguments={"text": 42, "times": "many"}),  # invalid arguments
        ToolCall(id="x", name="ecoh", arguments={"text": "hi"}),  # unknown tool
    ],
    ids=["invalid_arguments", "unknown_tool"],
)
def test_a_call_answered_at_submission_that_repeats_after_compaction_aborts_the_run_with_detection_off(
    gateway: ToolGateway, call: ToolCall
) -> None:
    # Given the default config (loop detection off), a run that has seen calls, then compacted
    assert not gateway.settings.tools.loop_detection
    gateway.call_tools(session_key="bad", run_id="r1", calls=[call.model_copy(update={"id": "before"})])
    assert gateway.note_compaction("bad", "r1")

    # When the model repeats the same call that is answered without running, again and again
    def repeat_until_aborted() -> None:
        for i in range(1, 10):
            gateway.call_tools(
                session_key="bad", run_id="r1", calls=[call.model_copy(update={"id": f"k{i}"})]
            )

    # Then the post-compaction guard stops the run, as it would for a call that ran
    with pytest.raises(CompactionLoopPersisted) as caught:
        repeat_until_aborted()
    assert caught.value.detector == "compaction_loop_persisted"
    assert caught.value.results[0].reason in {"invalid_arguments", "unknown_tool"}
    # And the aborted run refuses even a call that would be answered at submission
    with pytest.raises(CompactionLoopPersisted) as again:
        gateway.call_tools(session_key="bad", run_id="r1", calls=[call.model_copy(update={"id": "late"})])
    assert again.value.results[0].reason == "run_aborted"
