"""Safe by default: built-ins off unless enabled, allow/deny lists at the gateway and on the worker."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.harness import GatewayOn, Proc, WorkerOn, base_env, registration_fields, send_by_hand, wait_until
from workers import ToolCall, ToolGateway
from workers.celery_edge.names import INVOKE_TASK
from workers.core.models import CallJob

pytestmark = pytest.mark.timeout(90)


def _forge(gateway: ToolGateway, session: str, call: dict[str, object], agent_id: str = "main") -> None:
    """A registered call whose message goes straight onto the queue, past the gateway's policy.

    Registered as a gateway with other allow/deny lists would: the worker's own check must refuse it.
    """
    ledger = gateway._rt.ledger
    now = int(time.time() * 1000)
    job = CallJob.model_validate(
        {
            "session_key": session,
            "run_id": "r",
            "agent_id": agent_id,
            "call": call,
            "submitted_ms": now,
            "deadline_ms": now + 10_000,
            "soft_s": 2,
            "hard_s": 3,
        }
    )
    ledger.register(
        ledger.keys(session, "r"),
        job.call.id,
        now_ms=now,
        deadline_ms=now + 10_000,
        fields=registration_fields(job),
    )
    send_by_hand(
        gateway._app,
        INVOKE_TASK,
        kwargs={"job": job.model_dump(mode="json")},
        queue=gateway.settings.broker.queue,
    )


def _answer_of(gateway: ToolGateway, session: str, call_id: str) -> str | None:
    ledger = gateway._rt.ledger
    keys = ledger.keys(session, "r")
    wait_until(lambda: bool(ledger.results(keys, [call_id])), timeout_s=15, what=f"answer to {call_id}")
    return ledger.results(keys, [call_id])[call_id].reason


def test_a_default_worker_and_gateway_refuse_exec(worker: Proc, gateway: ToolGateway, tmp_path: Path) -> None:
    # Given no configuration at all: exec is not enabled
    marker = tmp_path / "ran"
    # When an agent calls it through the gateway
    [result] = gateway.call_tools(
        session_key="default",
        run_id="r1",
        calls=[ToolCall(id="d1", name="exec", arguments={"command": f"touch {marker}"})],
    )
    # Then it is answered at once as an unknown tool
    assert result.reason == "unknown_tool"
    assert "exec" not in [d["name"] for d in gateway.tool_definitions()]
    # And a message for it that skipped the gateway is answered by the worker, and runs nothing
    _forge(
        gateway,
        "default-forged",
        {"id": "d2", "name": "exec", "arguments": {"command": f"touch {marker}"}},
    )
    assert _answer_of(gateway, "default-forged", "d2") == "unknown_tool"
    assert not marker.exists()
    assert "d1#" not in worker.log()


@pytest.fixture
def policy_env(redis_url: str) -> dict[str, str]:
    # Built-ins enabled, a global allowlist without http_fetch, and an agent narrowed to echo.
    return base_env(
        redis_url,
        UNSTUCK_TOOLS__BUILTINS="exec,http_fetch",
        UNSTUCK_TOOLS__ALLOW="echo,boom,exec",
        UNSTUCK_AGENTS__LIST=json.dumps([{"id": "reader", "tool_allow": ["echo"]}]),
    )


@pytest.fixture
def policy_worker(policy_env: dict[str, str], worker_on: WorkerOn) -> Proc:
    return worker_on(policy_env, name="policy")


@pytest.fixture
def policy_gateway(policy_env: dict[str, str], gateway_on: GatewayOn) -> ToolGateway:
    return gateway_on(policy_env)


def test_a_tool_outside_the_allowlist_is_answered_at_submission_and_never_reaches_a_worker(
    policy_worker: Proc, policy_gateway: ToolGateway, tmp_path: Path
) -> None:
    # Given exec allowed globally but not for "reader", and http_fetch allowed for nobody
    marker = tmp_path / "ran"
    calls = [
        ToolCall(id="p-ok", name="echo", arguments={"text": "hi"}),
        ToolCall(id="p-exec", name="exec", arguments={"command": f"touch {marker}"}),
        ToolCall(id="p-fetch", name="http_fetch", arguments={"url": "http://127.0.0.1:9/"}),
    ]
    # When the reader agent calls all three
    results = policy_gateway.call_tools(session_key="pol", run_id="r1", agent_id="reader", calls=calls)
    # Then the allowed one runs, the others are answered tool_not_allowed
    assert [r.reason for r in results] == [None, "tool_not_allowed", "tool_not_allowed"]
    assert results[0].text == "hi"
    assert "not allowed" in results[1].text
    assert results[1].details["synthetic"] is True
    # And they are recorded in the ledger like any call answered at submission
    ledger = policy_gateway._rt.ledger
    keys = ledger.keys("pol", "r1")
    record = ledger.record(keys, "p-exec")
    assert record is not None
    assert "task_id" not in record.fields
    assert ledger.results(keys, ["p-exec"])["p-exec"].reason == "tool_not_allowed"
    # And the worker never saw them
    log = policy_worker.log()
    assert "p-ok#" in log
    assert "p-exec#" not in log
    assert "p-fetch#" not in log
    assert not marker.exists()
    # And the definitions offered to each agent match
    assert [d["name"] for d in policy_gateway.tool_definitions(agent_id="reader")] == ["echo"]
    assert [d["name"] for d in policy_gateway.tool_definitions(agent_id="main")] == ["boom", "echo", "exec"]


def test_the_main_agent_may_run_exec_when_the_allowlist_names_it(
    policy_worker: Proc, policy_gateway: ToolGateway
) -> None:
    [result] = policy_gateway.call_tools(
        session_key="pol-main",
        run_id="r1",
        calls=[ToolCall(id="m1", name="exec", arguments={"command": "echo hi"})],
    )
    assert not result.is_error
    assert '"exit_code": 0' in result.text


def test_a_message_for_a_denied_tool_that_reaches_the_worker_runs_nothing_and_is_answered(
    policy_worker: Proc, policy_gateway: ToolGateway, tmp_path: Path
) -> None:
    # Given messages that skipped the gateway: exec for "reader" (its allowlist lacks exec)
    # and http_fetch for main (outside the global allowlist)
    marker = tmp_path / "ran"
    _forge(
        policy_gateway,
        "pol-forged",
        {"id": "f-exec", "name": "exec", "arguments": {"command": f"touch {marker}"}},
        agent_id="reader",
    )
    _forge(
        policy_gateway,
        "pol-forged",
        {"id": "f-fetch", "name": "http_fetch", "arguments": {"url": "http://x/"}},
    )
    # Then the worker answers each tool_not_allowed through the normal result path, runs nothing
    assert _answer_of(policy_gateway, "pol-forged", "f-exec") == "tool_not_allowed"
    assert _answer_of(policy_gateway, "pol-forged", "f-fetch") == "tool_not_allowed"
    assert not marker.exists()
    wait_until(
        lambda: "not allowed for agent 'reader'" in policy_worker.log(), timeout_s=5, what="refusal log"
    )
