"""Cancel escalation and the ``cancelled`` answer (pure)."""

from __future__ import annotations

import pytest

from workers.core.cancellation import CancelStep, cancel_step, cancelled_result
from workers.core.models import ToolCall
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
