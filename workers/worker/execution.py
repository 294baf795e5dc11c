"""Run one tool with its retry policy and turn the outcome into a result (no Celery here).

The soft time limit arrives as an exception class this module does not know; callers
catch it before calling :func:`interrupted_result`.
"""

from __future__ import annotations

from collections.abc import Callable

from workers.core.cancellation import cancelled_result
from workers.core.models import CallJob, SyntheticReason, TextBlock, ToolResult
from workers.core.results import (
    fallback_result,
    rejected_result,
    success_result,
    synthetic_result,
    tool_error_result,
)
from workers.errors import InvalidArguments, ToolNotFound
from workers.redact import redact
from workers.tools.context import ToolContext
from workers.tools.registry import ToolSpec, get_tool, validate_arguments

__all__ = ["bounded_result", "interrupted_result", "run_tool"]


def interrupted_result(
    job: CallJob, spec: ToolSpec | None, reason: SyntheticReason, *, elapsed_ms: int, attempt: int
) -> ToolResult:
    """A call stopped by a limit: the tool's fallback if it has one, else a synthetic error."""
    if spec is not None and spec.has_fallback:
        return fallback_result(job.call, spec.fallback, reason, elapsed_ms=elapsed_ms, attempt=attempt)
    limit = {
        SyntheticReason.TIMEOUT_SOFT: job.soft_s,
        SyntheticReason.TIMEOUT_HARD: job.hard_s,
        SyntheticReason.HEARTBEAT_TIMEOUT: job.heartbeat_s,
    }.get(reason)
    return synthetic_result(job.call, reason, elapsed_ms=elapsed_ms, attempt=attempt, limit_s=limit)


def run_tool(
    job: CallJob,
    ctx: ToolContext,
    *,
    clock_ms: Callable[[], int],
    sleep: Callable[[float], None],
    interrupts: tuple[type[BaseException], ...] = (),
) -> ToolResult:
    """Validate, run with retries, and build the result.

    ``interrupts`` (the pool's soft-limit exception) propagate untouched even when they
    derive from ``Exception``.
    """
    started = job.submitted_ms
    try:
        spec = get_tool(job.call.name)
        arguments = validate_arguments(spec, job.call.arguments)
    except (ToolNotFound, InvalidArguments) as exc:
        return rejected_result(job.call, exc, clock_ms() - started)
    soft_end_ms = clock_ms() + int(job.soft_s * 1000)
    attempt = 1
    while True:
        try:
            value = spec.invoke(arguments, ctx)
            if ctx.cancel_settled():  # it stopped because it was cancelled: what it returned is partial
                return cancelled_result(
                    job.call, elapsed_ms=clock_ms() - started, attempt=attempt, partial=value
                )
            return success_result(job.call, value, elapsed_ms=clock_ms() - started, attempt=attempt)
        except interrupts:
            raise
        except Exception as exc:  # noqa: BLE001 - every tool failure becomes a result
            if ctx.cancel_settled():
                return cancelled_result(job.call, elapsed_ms=clock_ms() - started, attempt=attempt)
            if _retry_fits(spec, exc, attempt, soft_end_ms, clock_ms()):
                sleep(spec.retry.delay_s(attempt))
                attempt += 1
                continue
            return _failure_result(job, spec, exc, clock_ms() - started, attempt)


def _retry_fits(spec: ToolSpec, exc: Exception, attempt: int, soft_end_ms: int, now_ms: int) -> bool:
    return spec.retry.should_retry(exc, attempt) and now_ms + spec.retry.delay_s(attempt) * 1000 < soft_end_ms


def _failure_result(
    job: CallJob, spec: ToolSpec, exc: Exception, elapsed_ms: int, attempt: int
) -> ToolResult:
    if spec.has_fallback:
        return fallback_result(
            job.call, spec.fallback, SyntheticReason.TOOL_ERROR, elapsed_ms=elapsed_ms, attempt=attempt
        )
    return tool_error_result(job.call, type(exc).__name__, str(exc), elapsed_ms=elapsed_ms, attempt=attempt)


TRUNCATION_MARKER = "\n[... result truncated by unstuck: {dropped} of {total} bytes dropped ...]"


def bounded_result(result: ToolResult, *, max_bytes: int) -> ToolResult:
    """``result`` with secrets masked and its text capped at ``max_bytes`` (with a marker)."""
    text = redact(result.text)
    encoded = text.encode()
    details = dict(result.details)
    if len(encoded) > max_bytes:
        kept = encoded[:max_bytes].decode(errors="ignore")
        text = kept + TRUNCATION_MARKER.format(dropped=len(encoded) - max_bytes, total=len(encoded))
        details["truncated_bytes"] = len(encoded) - max_bytes
    if text == result.text and details == result.details:
        return result
    return result.model_copy(update={"content": (TextBlock(text=text),), "details": details})
