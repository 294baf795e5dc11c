"""Limit arithmetic for one call: soft, hard and heartbeat limits, deadline, retry backoff."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CallLimits", "RetryPolicy", "resolve_limits"]


@dataclass(frozen=True)
class RetryPolicy:
    """How often a failing tool is re-run inside its time budget.

    ``attempts`` counts the first run. A failure is retried when its exception class is
    listed in ``retry_on`` or it carries ``retryable = True``.
    """

    attempts: int = 1
    backoff_s: float = 0.5
    multiplier: float = 2.0
    max_backoff_s: float = 10.0
    retry_on: tuple[type[BaseException], ...] = ()
    #: Exception class names retried too, matched along the class's bases (``tools.retry`` in
    #: config cannot name classes): ``("Exception",)`` retries every failure.
    retry_on_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.backoff_s < 0 or self.max_backoff_s < 0 or self.multiplier < 1:
            raise ValueError("backoff must be >= 0 and multiplier >= 1")

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        """Whether ``error`` on attempt number ``attempt`` (1-based) earns another attempt."""
        if attempt >= self.attempts:
            return False
        if isinstance(error, self.retry_on) or bool(getattr(error, "retryable", False)):
            return True
        return any(cls.__name__ in self.retry_on_names for cls in type(error).__mro__)

    def delay_s(self, attempt: int) -> float:
        """Backoff before attempt ``attempt + 1``."""
        return float(min(self.max_backoff_s, self.backoff_s * self.multiplier ** (attempt - 1)))


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
