"""Hostile broker messages: never code execution, always an answer for a call that exists."""

from __future__ import annotations

import time

import pytest

from tests.harness import Proc, wait_until
from workers import ToolCall, ToolGateway
from workers.task_names import INVOKE_TASK


def _forged_job(session: str, call: dict[str, object]) -> dict[str, object]:
    now = int(time.time() * 1000)
    return {
        "session_key": session,
        "run_id": "r",
        "call": call,
        "submitted_ms": now,
        "deadline_ms": now + 10_000,
        "soft_s": 2,
        "hard_s": 3,
    }


@pytest.mark.timeout(60)
def test_forged_message_naming_an_unregistered_tool_is_answered_unknown_tool(
    worker: Proc, gateway: ToolGateway
) -> None:
    # Given a message that reached the queue without the gateway, naming a tool nobody registered
    ledger = gateway._rt.ledger
    keys = ledger.keys("forged", "r")
    ledger.register(
        keys, "f1", now_ms=int(time.time() * 1000), deadline_ms=int(time.time() * 1000) + 10_000, fields={}
    )
    job = _forged_job(
        "forged", {"id": "f1", "name": "os.system", "arguments": {"command": "touch /tmp/pwned"}}
    )
    gateway._app.send_task(INVOKE_TASK, kwargs={"job": job}, queue=gateway.settings.broker.queue)
    # Then the worker answers it as an unknown tool and runs nothing
    wait_until(lambda: bool(ledger.results(keys, ["f1"])), timeout_s=10, what="answer to the forged call")
    assert ledger.results(keys, ["f1"])["f1"].reason == "unknown_tool"


@pytest.mark.timeout(60)
def test_malformed_body_and_unregistered_task_are_refused_and_the_worker_keeps_serving(
    worker: Proc, gateway: ToolGateway
) -> None:
    # Given garbage bodies and a task name the worker does not know
    queue = gateway.settings.broker.queue
    gateway._app.send_task(INVOKE_TASK, kwargs={"job": {"session_key": "x", "evil": True}}, queue=queue)
    gateway._app.send_task("os.system", args=["touch /tmp/pwned"], queue=queue)
    # When a genuine call follows
    wait_until(lambda: "refused invoke message" in worker.log(), timeout_s=10, what="refusal logged")
    wait_until(lambda: "unregistered task" in worker.log().lower(), timeout_s=10, what="unknown task logged")
    (result,) = gateway.call_tools(
        session_key="after-forgery",
        run_id="r",
        calls=[ToolCall(id="ok", name="echo", arguments={"text": "fine"})],
    )
    # Then it is served normally
    assert result.text == "fine"
