"""Cancellation with a real worker: the answer is ``cancelled`` once, and no tool process is left.

``exec`` runs ``sh -c`` in its own process group; the checks look for any process of that
group with psutil, so a backgrounded grandchild left running would fail them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Coroutine
from typing import Any

import psutil
import pytest

from tests.harness import UNSTUCK, Proc, wait_until
from workers.core.models import ToolCall, ToolResult
from workers.gateway.client import ToolGateway
from workers.store.ledger import Ledger

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]

GRACE_S = 2.0
# A shell that backgrounds a child and waits: two processes in the group, output first.
SLEEPER = "echo started; sleep 60 & sleep 60; wait"


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    return {**env, "UNSTUCK_TOOLS__BUILTINS": "exec", "UNSTUCK_LIMITS__CANCEL_GRACE_S": str(GRACE_S)}


class Background:
    """``call_tools`` in a thread; its results (or error) once it returns."""

    def __init__(self, gateway: ToolGateway, session: str, calls: list[ToolCall]) -> None:
        self.results: list[ToolResult] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(gateway, session, calls), daemon=True)
        self.thread.start()

    def _run(self, gateway: ToolGateway, session: str, calls: list[ToolCall]) -> None:
        try:
            self.results = gateway.call_tools(session_key=session, run_id="r1", calls=calls)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc

    def join(self, timeout_s: float = 30) -> list[ToolResult]:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "call_tools did not return"
        assert self.error is None, self.error
        return self.results


def group_members(pgid: int) -> list[int]:
    members = []
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


def running_group(ledger: Ledger, session: str, call_id: str, size: int = 2) -> int:
    """The process group the exec call recorded, once ``size`` processes run in it."""
    keys = ledger.keys(session, "r1")
    found: list[int] = []

    def started() -> bool:
        found[:] = ledger.process_groups(keys, call_id)
        return bool(found) and len(group_members(found[0])) >= size

    wait_until(started, timeout_s=30, what="the exec call's process group")
    return found[0]


async def answered_cancelled(ledger: Ledger, session: str, call_id: str, *, timeout_s: float) -> None:
    """Await the call's one answer in the ledger (off the loop) and check it says cancelled."""
    keys = ledger.keys(session, "r1")

    def answered() -> bool:
        record = ledger.record(keys, call_id)
        return record is not None and record.result is not None

    await asyncio.to_thread(wait_until, answered, timeout_s=timeout_s, what=f"{call_id}'s answer")
    record = ledger.record(keys, call_id)
    assert record is not None
    assert record.result is not None
    assert record.result.reason == "cancelled"


def exec_call(call_id: str, command: str = SLEEPER) -> ToolCall:
    return ToolCall(id=call_id, name="exec", arguments={"command": command})


def test_a_cancelled_exec_answers_cancelled_with_its_output_and_leaves_no_process(
    worker: Proc, gateway: ToolGateway, ledger: Ledger
) -> None:
    # Given an exec call whose shell and backgrounded child are running
    background = Background(gateway, "s-exec", [exec_call("c1")])
    pgid = running_group(ledger, "s-exec", "c1")  # the sleeps run, so "echo started" has run
    # When the agent cancels it
    began = time.monotonic()
    assert gateway.cancel("s-exec", "r1", "c1") == 1
    (result,) = background.join()
    # Then it is answered cancelled, with the output so far, before the grace (SIGTERM was enough)
    assert result.reason == "cancelled"
    assert result.details["partial"]["stdout"].startswith("started")
    assert time.monotonic() - began < GRACE_S
    # And no process of the tool's group is left
    wait_until(lambda: not group_members(pgid), timeout_s=5, what=f"process group {pgid} to be gone")
    # And the ledger holds that one answer
    record = ledger.record(ledger.keys("s-exec", "r1"), "c1")
    assert record is not None
    assert record.result == result


def test_a_group_that_ignores_sigterm_is_killed_after_the_grace(
    worker: Proc, gateway: ToolGateway, ledger: Ledger
) -> None:
    # Given a command whose shell and child ignore SIGTERM
    background = Background(gateway, "s-trap", [exec_call("c1", "trap '' TERM; sleep 60 & sleep 60; wait")])
    pgid = running_group(ledger, "s-trap", "c1")
    # When it is cancelled
    began = time.monotonic()
    gateway.cancel("s-trap", "r1")
    (result,) = background.join()
    # Then SIGKILL after the grace ends it: answered cancelled, no process left
    assert result.reason == "cancelled"
    assert GRACE_S <= time.monotonic() - began < GRACE_S + 3
    wait_until(lambda: not group_members(pgid), timeout_s=5, what=f"process group {pgid} to be gone")


def test_a_tool_that_never_looks_is_answered_by_the_worker_after_the_grace(
    worker: Proc, gateway: ToolGateway
) -> None:
    # Given a Python tool that ignores ctx.cancelled (it sleeps 30 s)
    background = Background(gateway, "s-slow", [ToolCall(id="c1", name="slow", arguments={"seconds": 30})])
    wait_until(lambda: gateway.cancel("s-slow", "r1") == 1, timeout_s=10, what="the call to be registered")
    # Then the worker's main process answers cancelled once the grace and one tick are over
    began = time.monotonic()
    (result,) = background.join()
    assert result.reason == "cancelled"
    assert time.monotonic() - began < GRACE_S + 4


def test_a_call_no_worker_holds_is_answered_at_once(gateway: ToolGateway, ledger: Ledger) -> None:
    # Given a call registered while no worker runs
    background = Background(gateway, "s-idle", [ToolCall(id="c1", name="echo", arguments={"text": "x"})])
    keys = ledger.keys("s-idle", "r1")
    wait_until(lambda: ledger.record(keys, "c1") is not None, timeout_s=10, what="registration")
    # When it is cancelled
    began = time.monotonic()
    assert gateway.cancel("s-idle", "r1") == 1
    # Then it is answered at once, and a second cancel finds nothing left to cancel
    (result,) = background.join()
    assert result.reason == "cancelled"
    assert "before it started" in result.text
    assert time.monotonic() - began < 2
    assert gateway.cancel("s-idle", "r1") == 0


def _kill(env: dict[str, str], session: str, *extra: str) -> str:
    done = subprocess.run(
        [UNSTUCK, "session", "kill", session, *extra], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_session_kill_terminates_running_tools(
    worker: Proc, gateway: ToolGateway, ledger: Ledger, env: dict[str, str]
) -> None:
    # Given a session running an exec call
    background = Background(gateway, "s-kill", [exec_call("c1")])
    pgid = running_group(ledger, "s-kill", "c1")
    # When the operator kills the session
    assert "running tools stopped" in _kill(env, "s-kill")
    # Then the call is answered cancelled at once and the tool's processes are gone after the grace
    (result,) = background.join()
    assert result.reason == "cancelled"
    wait_until(lambda: not group_members(pgid), timeout_s=GRACE_S + 5, what=f"group {pgid} to be gone")


def test_session_kill_let_finish_leaves_running_tools_alone(
    worker: Proc, gateway: ToolGateway, ledger: Ledger, env: dict[str, str]
) -> None:
    # Given a session running an exec call
    background = Background(gateway, "s-let", [exec_call("c1")])
    pgid = running_group(ledger, "s-let", "c1")
    try:
        # When the operator kills the session but lets running tools finish
        assert "running tools left running" in _kill(env, "s-let", "--let-finish")
        (result,) = background.join()
        # Then the agent has its answer, and the tool still runs well past the grace (the old behaviour)
        assert result.reason == "cancelled"
        deadline = time.monotonic() + GRACE_S + 2
        while time.monotonic() < deadline:
            assert len(group_members(pgid)) >= 2, "the tool was stopped"
            time.sleep(0.2)
    finally:
        os.killpg(pgid, signal.SIGKILL)


def _awaited_calls(agateway: ToolGateway, entry: str, call: ToolCall) -> Coroutine[Any, Any, object]:
    """``acall_tools`` or, in the neutral provider format, ``acall_tools_in`` for one call."""
    if entry == "acall_tools":
        return agateway.acall_tools(session_key="s-async", run_id="r1", calls=[call])
    message = {"calls": [{"id": call.id, "name": call.name, "arguments": call.arguments}]}
    return agateway.acall_tools_in("neutral", message, session_key="s-async", run_id="r1")


@pytest.mark.parametrize("entry", ["acall_tools", "acall_tools_in"])
async def test_cancelling_an_acall_tools_task_cancels_its_calls(
    worker: Proc, agateway: ToolGateway, ledger: Ledger, entry: str
) -> None:
    # Given an awaited acall_tools (or acall_tools_in) whose exec call is running
    task = asyncio.create_task(_awaited_calls(agateway, entry, exec_call("c1")))
    pgid = await asyncio.to_thread(running_group, ledger, "s-async", "c1")
    # When the task is cancelled
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Then the call is answered cancelled in the ledger and its processes are gone
    await answered_cancelled(ledger, "s-async", "c1", timeout_s=GRACE_S + 5)
    await asyncio.to_thread(
        wait_until, lambda: not group_members(pgid), timeout_s=5, what=f"group {pgid} to be gone"
    )


async def test_an_acall_tools_task_cancelled_before_its_calls_are_registered_still_cancels_them(
    worker: Proc, agateway: ToolGateway, ledger: Ledger
) -> None:
    # Given an acall_tools task cancelled as soon as its worker thread started
    task = asyncio.create_task(
        agateway.acall_tools(session_key="s-early", run_id="r1", calls=[exec_call("c1")])
    )
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Then the call, registered after the cancel, is answered cancelled all the same
    await answered_cancelled(ledger, "s-early", "c1", timeout_s=GRACE_S + 8)
    # And if it had started, its process group is gone
    groups = ledger.process_groups(ledger.keys("s-early", "r1"), "c1")

    def gone() -> bool:
        return not any(group_members(pgid) for pgid in groups)

    await asyncio.to_thread(wait_until, gone, timeout_s=GRACE_S + 5, what="the tool's process groups gone")
