"""Cancelling a running call: when the worker escalates, and the answer it gives (pure, ``now`` in).

A cancel request is a mark on the call record. A cooperative tool sees it as
``ctx.cancelled`` and stops on its own; the worker's main process sends SIGTERM to the
tool's process groups as soon as it sees the mark, and once ``grace`` (plus the lease
keeper's own tick as slack) has passed without an answer it answers ``cancelled`` itself,
SIGKILLs the groups and interrupts the pool child.
"""

from __future__ import annotations

import enum
from typing import Any

from workers.core.models import SyntheticReason, ToolCall, ToolResult
from workers.core.results import render_value, synthetic_result

__all__ = ["CancelStep", "cancel_step", "cancelled_result"]

PARTIAL_TEXT_LIMIT = 4000


class CancelStep(enum.StrEnum):
    """What the worker's main process does about a cancel request on one of its running calls."""

    WAIT = "wait"  # already asked to stop; the grace is still running
    TERMINATE = "terminate"  # first sighting: SIGTERM the process groups, let the tool wind up
    KILL = "kill"  # grace over: answer cancelled, SIGKILL the groups, interrupt the child


def cancel_step(
    *, requested_ms: int, now_ms: int, grace_ms: int, slack_ms: int, terminated: bool
) -> CancelStep:
    """The next step for a call whose cancel was requested at ``requested_ms``."""
    if now_ms >= requested_ms + grace_ms + slack_ms:
        return CancelStep.KILL
    return CancelStep.WAIT if terminated else CancelStep.TERMINATE


def cancelled_result(
    call: ToolCall, *, elapsed_ms: int, attempt: int, detail: str = "", partial: Any = None
) -> ToolResult:
    """The ``cancelled`` answer, with what the tool produced before it stopped (if anything)."""
    extra: dict[str, Any] = {}
    if partial is not None:
        extra["partial"] = partial
        detail += "; what it produced before stopping: " + render_value(partial)[:PARTIAL_TEXT_LIMIT]
    return synthetic_result(
        call, SyntheticReason.CANCELLED, elapsed_ms=elapsed_ms, attempt=attempt, detail=detail, extra=extra
    )
