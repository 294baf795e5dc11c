"""Cancel escalation and the ``cancelled`` answer (pure)."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil
import pytest

from workers.core.cancel import CancelStep, cancel_step, cancelled_result
from workers.core.models import ToolCall
from workers.tools.builtins import exec_command
from workers.tools.context import ToolContext


@pytest.mark.parametrize(
    ("now_ms", "terminated", "expected"),
    [
        (1_000, False, CancelStep.TERMINATE),  # first sight: SIGTERM
        (1_000, True, CancelStep.WAIT),
        (3_999, True, CancelStep.WAIT),  # grace 2 s + slack 1 s not over
        (4_000, True, CancelStep.KILL),
        (9_000, False, CancelStep.KILL),  # seen only after the grace (e.g. a worker restart)
    ],
)
def test_escalation(now_ms: int, terminated: bool, expected: CancelStep) -> None:
    step = cancel_step(
        requested_ms=1_000, now_ms=now_ms, grace_ms=2_000, slack_ms=1_000, terminated=terminated
    )
    assert step is expected


def test_the_answer_keeps_the_partial_output() -> None:
    result = cancelled_result(
        ToolCall(id="c", name="exec"), elapsed_ms=5, attempt=1, partial={"stdout": "half"}
    )
    assert result.is_error
    assert result.reason == "cancelled"
    assert result.details["partial"] == {"stdout": "half"}
    assert "half" in result.text


def test_without_partial_output_the_answer_says_only_cancelled() -> None:
    result = cancelled_result(ToolCall(id="c", name="exec"), elapsed_ms=5, attempt=1)
    assert "partial" not in result.details
    assert "cancelled" in result.text


def test_ctx_cancelled_asks_the_store_at_most_once_per_interval_and_latches() -> None:
    now = [0.0]
    answers = iter([False, True])
    asked: list[float] = []

    def check() -> bool:
        asked.append(now[0])
        return next(answers)

    ctx = ToolContext(
        session_key="s", run_id="r", call_id="c", attempt=1, deadline_ms=0, clock=lambda: now[0],
        on_heartbeat=lambda _: None, on_process_group=lambda _: None, on_cancel_check=check,
    )  # fmt: skip
    assert ctx.cancelled is False
    now[0] = 0.1
    assert ctx.cancelled is False  # within the interval: not asked again
    now[0] = 0.3
    assert ctx.cancelled is True
    now[0] = 5.0
    assert ctx.cancelled is True  # latched: the store is not asked again
    assert asked == [0.0, 0.3]


def test_exec_stops_its_group_when_cancelled_and_returns_the_output_so_far() -> None:
    # Given an exec whose shell backgrounds a child; the cancel arrives once both run
    groups: list[int] = []

    def cancelled() -> bool:
        return bool(groups) and len(_members(groups[0])) >= 2

    ctx = ToolContext(
        session_key="s", run_id="r", call_id="c", attempt=1, deadline_ms=0, clock=time.monotonic,
        on_heartbeat=lambda _: None, on_process_group=groups.append, on_cancel_check=cancelled,
        cancel_grace_s=2.0,
    )  # fmt: skip
    began = time.monotonic()
    # When it runs
    output = exec_command(ctx, command="echo started; sleep 30 & sleep 30; wait")
    # Then SIGTERM ended it well before the grace, with the output so far, and nothing is left
    assert ctx.cancel_seen
    assert output["stdout"] == "started\n"
    assert output["exit_code"] == -signal.SIGTERM
    assert time.monotonic() - began < ctx.cancel_grace_s  # not the grace: SIGTERM ended it
    assert _members(groups[0]) == []


def _members(pgid: int) -> list[int]:
    found = []
    for process in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(process.pid)
    return found
