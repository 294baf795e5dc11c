"""A call's limits: soft, hard and heartbeat limits and the deadline, derived at submission."""

from __future__ import annotations

from dataclasses import dataclass

from workers.core.models import SyntheticReason

__all__ = ["CallLimits", "escaped_soft_limit_reason", "resolve_limits"]


@dataclass(frozen=True)
class CallLimits:
    """The limits one call runs under, all derived at submission time."""

    soft_s: float
    hard_s: float
    heartbeat_s: float | None
    submitted_ms: int
    deadline_ms: int


def resolve_limits(
    *,
    now_ms: int,
    soft_s: float,
    declared_hard_s: float | None,
    heartbeat_s: float | None,
    hard_grace_s: float,
    queue_allowance_s: float,
    run_deadline_ms: int | None = None,
) -> CallLimits:
    """Derive a call's limits; a run deadline that comes sooner shrinks them to fit.

    The deadline covers queue wait plus the hard limit, so a result written at the hard
    limit by the worker always lands before the gateway gives up.
    """
    hard_s = declared_hard_s if declared_hard_s is not None else soft_s + hard_grace_s
    hard_s = max(hard_s, soft_s)
    deadline_ms = now_ms + int((queue_allowance_s + hard_s) * 1000)
    if run_deadline_ms is not None and run_deadline_ms < deadline_ms:
        budget_s = max(0.001, (run_deadline_ms - now_ms) / 1000)
        scale = budget_s / (queue_allowance_s + hard_s)
        soft_s, hard_s = soft_s * scale, hard_s * scale
        deadline_ms = max(now_ms, run_deadline_ms)
    return CallLimits(
        soft_s=soft_s,
        hard_s=hard_s,
        heartbeat_s=heartbeat_s,
        submitted_ms=now_ms,
        deadline_ms=deadline_ms,
    )


# The task's start and the pool's soft-limit timer are read from different clocks a few
# microseconds apart; an interrupt this close to the soft limit is still the call's own.
_CLOCK_SLACK_S = 0.01


def escaped_soft_limit_reason(*, started_s: float, now_s: float, soft_s: float) -> SyntheticReason:
    """The answer for a task the soft-limit interrupt ended outside the tool's body.

    The pool interrupts a task at its soft limit wherever it is: under load that can be
    unstuck's own code around the tool (claiming the call), which then ends the task instead of
    the tool. The call's soft limit passed: ``timeout_soft``, not a crash. An interrupt before
    it was meant for an earlier job of the same pool process (its timer fired after that job
    ended): the task broke, ``crashed``.
    """
    if now_s - started_s + _CLOCK_SLACK_S >= soft_s:
        return SyntheticReason.TIMEOUT_SOFT
    return SyntheticReason.CRASHED
