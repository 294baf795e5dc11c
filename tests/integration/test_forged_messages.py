"""Hostile broker messages: only the job a gateway registered runs; a call that exists is answered.

``record_run`` appends one line to a file per execution, so "ran nothing" is checked by
reading that file, not by trusting the worker's log.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.harness import (
    Proc,
    base_env,
    registration_fields,
    send_by_hand,
    start_watchdog,
    task_outcome,
    wait_until,
)
from tests.signing import invoke_body, publish_raw
from workers import ToolCall, ToolGateway
from workers.celery_edge.names import INVOKE_TASK, SWEEP_TASK
from workers.core.models import CallJob
from workers.core.refusal import RefusalReason
from workers.store.ledger import Ledger
from workers.store.records import CallField
from workers.store.refusal import refusal_counts

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def runs_file(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture
def env(redis_url: str, runs_file: Path) -> dict[str, str]:
    return base_env(redis_url, RECORD_RUN_FILE=str(runs_file))


def _runs(runs_file: Path) -> list[str]:
    return runs_file.read_text().splitlines() if runs_file.exists() else []


def _job(session: str, call: dict[str, Any], **changes: Any) -> CallJob:
    now = int(time.time() * 1000)
    fields = {"session_key": session, "run_id": "r", "call": call, "submitted_ms": now}
    fields |= {"deadline_ms": now + 10_000, "soft_s": 2, "hard_s": 3}
    return CallJob.model_validate(fields | changes)


def _register(ledger: Ledger, job: CallJob) -> None:
    """Register ``job`` exactly as the gateway's dispatcher does (tool and job digest)."""
    keys = ledger.keys(job.session_key, job.run_id)
    fields = {**registration_fields(job), "dispatched": "1"}
    assert ledger.register(
        keys, job.call.id, now_ms=job.submitted_ms, deadline_ms=job.deadline_ms, fields=fields
    )


def _publish(gateway: ToolGateway, job: CallJob | dict[str, Any]) -> str:
    """Put a message straight onto the tool queue, past every gateway check; returns its task id."""
    body = job.model_dump(mode="json") if isinstance(job, CallJob) else job
    task_id = f"forged-{uuid.uuid4().hex[:8]}"
    send_by_hand(
        gateway._app, INVOKE_TASK, kwargs={"job": body}, task_id=task_id, queue=gateway.settings.broker.queue
    )
    return task_id


def _outcome(worker: Proc, task_id: str) -> str:
    """How the invoke task of ``task_id`` ended (see :func:`tests.harness.task_outcome`)."""
    wait_until(lambda: task_outcome(worker.log(), task_id) is not None, timeout_s=15, what=f"task {task_id}")
    return str(task_outcome(worker.log(), task_id))


def _refused(gateway: ToolGateway) -> dict[RefusalReason, int]:
    ledger = gateway._rt.ledger
    return refusal_counts(ledger.client, ledger.prefix)


def test_a_registered_call_of_a_tool_the_worker_lacks_is_answered_unknown_tool(
    worker: Proc, gateway: ToolGateway
) -> None:
    # Given a registered call naming a tool no worker has (a gateway with other tool modules)
    ledger = gateway._rt.ledger
    job = _job("forged", {"id": "f1", "name": "os.system", "arguments": {"command": "touch /tmp/pwned"}})
    _register(ledger, job)
    _publish(gateway, job)
    # Then the worker answers it as an unknown tool and runs nothing
    keys = ledger.keys("forged", "r")
    wait_until(lambda: bool(ledger.results(keys, ["f1"])), timeout_s=10, what="answer to the forged call")
    assert ledger.results(keys, ["f1"])["f1"].reason == "unknown_tool"


def test_malformed_body_and_unregistered_task_are_refused_and_the_worker_keeps_serving(
    worker: Proc, gateway: ToolGateway
) -> None:
    # Given garbage bodies and a task name the worker does not know
    queue = gateway.settings.broker.queue
    task_id = _publish(gateway, {"session_key": "x", "evil": True})
    send_by_hand(gateway._app, "os.system", args=["touch /tmp/pwned"], queue=queue)
    headers, properties, _ = invoke_body(gateway._app, {}, "empty-body")
    publish_raw(gateway._app, queue, headers, properties, b"", signed=False)  # stopped the worker once
    # When a genuine call follows
    wait_until(lambda: f"refused invoke message {task_id} (unreadable)" in worker.log(), timeout_s=10)
    wait_until(lambda: "unregistered task" in worker.log().lower(), timeout_s=10, what="unknown task logged")
    (result,) = gateway.call_tools(
        session_key="after-forgery",
        run_id="r",
        calls=[ToolCall(id="ok", name="echo", arguments={"text": "fine"})],
    )
    # Then it is served normally, and the refusals were counted
    assert result.text == "fine"
    assert "Unrecoverable error" not in worker.log()
    assert _refused(gateway)[RefusalReason.UNREADABLE] == 1


def test_a_forged_message_for_a_registered_tool_and_an_unregistered_call_runs_nothing(
    worker: Proc, gateway: ToolGateway, runs_file: Path
) -> None:
    # Given well-formed messages for a registered tool whose calls no gateway registered
    ledger = gateway._rt.ledger
    ghosts = [
        _job("ghost", {"id": f"g{n}", "name": "record_run", "arguments": {"tag": "ghost"}}) for n in range(3)
    ]
    task_ids = [_publish(gateway, job) for job in ghosts]
    # Then each is refused as unregistered, logged with its task id, and nothing runs
    assert [_outcome(worker, task_id) for task_id in task_ids] == ["unregistered"] * 3
    for task_id in task_ids:
        assert f"refused invoke message {task_id} (unregistered)" in worker.log()
    assert _runs(runs_file) == []
    # And the claim created no record for them (no call appears out of a forged message)
    assert all(ledger.record(ledger.keys("ghost", "r"), f"g{n}") is None for n in range(3))
    assert _refused(gateway)[RefusalReason.UNREGISTERED] == 3


def test_a_registered_call_whose_message_was_altered_runs_nothing_and_is_answered(
    worker: Proc, gateway: ToolGateway, runs_file: Path
) -> None:
    # Given calls registered by the gateway's rules, and messages for them altered on the way
    ledger = gateway._rt.ledger
    keys = ledger.keys("altered", "r")
    registered = {
        n: _job("altered", {"id": f"a{n}", "name": "record_run", "arguments": {"tag": "registered"}})
        for n in range(4)
    }
    for job in registered.values():
        _register(ledger, job)
    altered = [
        registered[0].model_copy(
            update={"call": ToolCall(id="a0", name="record_run", arguments={"tag": "evil"})}
        ),
        registered[1].model_copy(update={"call": ToolCall(id="a1", name="echo", arguments={"text": "x"})}),
        registered[2].model_copy(update={"agent_id": "admin"}),
        registered[3].model_copy(update={"soft_s": 600.0, "hard_s": 900.0}),
    ]
    task_ids = [_publish(gateway, job) for job in altered]
    # Then none runs, each is refused as a mismatch and the call is answered call_mismatch
    assert [_outcome(worker, task_id) for task_id in task_ids] == ["mismatch"] * 4
    results = ledger.results(keys, [f"a{n}" for n in range(4)])
    assert {r.reason for r in results.values()} == {"call_mismatch"}
    assert {r.tool_name for r in results.values()} == {"record_run"}  # the registered tool, not the forged
    assert "did not match" in results["a1"].text
    assert _runs(runs_file) == []
    assert _refused(gateway)[RefusalReason.MISMATCH] == 4
    # And the genuine message that arrives afterwards finds the call answered: still nothing runs
    assert _outcome(worker, _publish(gateway, registered[0])) == "reported"
    assert _runs(runs_file) == []


def test_an_altered_message_for_a_call_a_live_worker_runs_is_refused_without_an_answer(
    worker: Proc, gateway: ToolGateway, runs_file: Path
) -> None:
    # Given a registered call claimed by a live worker (its lease held)
    ledger = gateway._rt.ledger
    keys = ledger.keys("held", "r")
    job = _job("held", {"id": "h1", "name": "record_run", "arguments": {"tag": "registered"}})
    _register(ledger, job)
    digest = registration_fields(job)["job_digest"]
    claim = ledger.claim(
        keys, "h1", worker_id="other:1", now_ms=job.submitted_ms, tool="record_run", job_digest=digest
    )
    assert claim.status == "claimed"
    # When an altered message for it arrives
    altered = job.model_copy(update={"call": ToolCall(id="h1", name="record_run", arguments={"tag": "evil"})})
    # Then it runs nothing and leaves the call to the worker running it
    assert _outcome(worker, _publish(gateway, altered)) == "mismatch_held"
    assert ledger.results(keys, ["h1"]) == {}
    assert _runs(runs_file) == []


def test_replays_of_a_finished_call_run_nothing(worker: Proc, gateway: ToolGateway, runs_file: Path) -> None:
    # Given a call the gateway ran once
    ledger = gateway._rt.ledger
    call = ToolCall(id="once", name="record_run", arguments={"tag": "once"})
    (result,) = gateway.call_tools(session_key="replay", run_id="r", calls=[call])
    assert result.text == "recorded once"
    assert _runs(runs_file) == ["once"]
    # When its registered message is published again, several times
    record = ledger.record(ledger.keys("replay", "r"), "once")
    assert record is not None
    job = CallJob.model_validate_json(record.row.text(CallField.JOB))
    outcomes = [_outcome(worker, _publish(gateway, job)) for _ in range(3)]
    # Then every replay finds the call answered, reports that answer, and runs nothing
    assert outcomes == ["reported"] * 3
    assert _runs(runs_file) == ["once"]


def test_an_empty_body_on_the_control_queue_does_not_stop_the_watchdog(
    env: dict[str, str], gateway: ToolGateway
) -> None:
    # Given the watchdog, and a message with an empty body on its queue (it stopped the watchdog once)
    watchdog = start_watchdog(env, name="forged")
    try:
        app, queue = gateway._app, gateway.settings.broker.control_queue
        message = app.amqp.as_task_v2("empty-control", SWEEP_TASK, kwargs={})
        publish_raw(app, queue, message.headers, message.properties, b"", signed=False)
        # Then it is refused and counted, and the watchdog keeps running
        wait_until(lambda: "refused task message empty-control (undecodable)" in watchdog.log(), timeout_s=15)
        assert "Unrecoverable error" not in watchdog.log()
        assert watchdog.process.poll() is None
        # (the refusal is logged, then counted: wait for the count, do not race it)
        wait_until(lambda: _refused(gateway)[RefusalReason.UNDECODABLE] == 1, timeout_s=5, what="the count")
    finally:
        watchdog.kill()
