"""Run one tool with its retry policy and turn the outcome into a result (no Celery here).

The soft time limit arrives as an exception class this module does not know; callers
catch it before calling :func:`interrupted_result`.
"""

from __future__ import annotations

from collections.abc import Callable

from workers.core.cancel import cancelled_result
from workers.core.failure_policy import NO_RULES, FailureRules
from workers.core.memory_limits import OomCause, out_of_memory_result
from workers.core.models import CallJob, RetryPolicy, SyntheticReason, TextBlock, ToolResult
from workers.core.redact import redact
from workers.core.results import rejected_result, success_result, synthetic_result, tool_error_result
from workers.errors import InvalidArguments, ToolCrashed, ToolNotFound
from workers.tools.context import ToolContext
from workers.tools.registry import get_tool, registered_tools, validate_arguments
from workers.worker.branching import settle_failure

__all__ = [
    "bounded_result",
    "interrupted_result",
    "memory_exceeded_result",
    "run_tool",
    "soft_timeout_result",
]


def interrupted_result(
    job: CallJob,
    reason: SyntheticReason,
    *,
    elapsed_ms: int,
    attempt: int,
    memory_limit_mb: int | None = None,
) -> ToolResult:
    """A call stopped by a limit: a synthetic error (the answering service adds the tool's fallback).

    ``memory_limit_mb`` is the limit an ``out_of_memory`` call ran under (the job does not carry it).
    """
    if reason is SyntheticReason.OUT_OF_MEMORY:
        return out_of_memory_result(
            job.call,
            limit_mb=memory_limit_mb,
            cause=OomCause.CHILD_KILLED,
            elapsed_ms=elapsed_ms,
            attempt=attempt,
        )
    limit = {
        SyntheticReason.TIMEOUT_SOFT: job.soft_s,
        SyntheticReason.TIMEOUT_HARD: job.hard_s,
        SyntheticReason.HEARTBEAT_TIMEOUT: job.heartbeat_s,
    }.get(reason)
    return synthetic_result(job.call, reason, elapsed_ms=elapsed_ms, attempt=attempt, limit_s=limit)


def memory_exceeded_result(
    job: CallJob,
    cause: OomCause,
    *,
    limit_mb: int | None,
    elapsed_ms: int,
    attempt: int,
    partial: object = None,
) -> ToolResult:
    """A call past its memory limit, found in the pool child: ``out_of_memory``.

    ``partial`` is the text of what the tool returned after a process it started was killed.
    """
    return out_of_memory_result(
        job.call, limit_mb=limit_mb, cause=cause, elapsed_ms=elapsed_ms, attempt=attempt, partial=partial
    )


def soft_timeout_result(
    job: CallJob,
    ctx: ToolContext,
    *,
    attempt: int,
    clock_ms: Callable[[], int],
    rules: FailureRules = NO_RULES,
    allows: Callable[[str], bool] = lambda _tool: True,
) -> ToolResult:
    """The answer after the soft limit: the fail-branch (in the hard limit's grace), else as above.

    Called in the pool child right after it caught the soft-limit exception, which fires once
    per task: the branch then runs until the hard limit at most.
    """
    elapsed_ms = clock_ms() - job.submitted_ms
    if ctx.cancel_seen or ctx.on_cancel_check():
        # A cancel interrupts the child the way the soft limit does: never branch after a cancel.
        return cancelled_result(job.call, elapsed_ms=elapsed_ms, attempt=attempt)
    # The bare timeout first: the branch comes before any fallback.
    stopped = interrupted_result(job, SyntheticReason.TIMEOUT_SOFT, elapsed_ms=elapsed_ms, attempt=attempt)
    spec = registered_tools().get(job.call.name)
    return settle_failure(job, ctx, spec, stopped, rules=rules, clock_ms=clock_ms, allows=allows)


def run_tool(
    job: CallJob,
    ctx: ToolContext,
    *,
    clock_ms: Callable[[], int],
    sleep: Callable[[float], None],
    interrupts: tuple[type[BaseException], ...] = (),
    rules: FailureRules = NO_RULES,
    allows: Callable[[str], bool] = lambda _tool: True,
) -> ToolResult:
    """Validate, run with retries, and build the result (the fail-branch on failure).

    ``interrupts`` (the pool's soft-limit exception) propagate untouched even when they
    derive from ``Exception``, and so does ``MemoryError`` (never retried: it is
    ``out_of_memory``). ``rules`` are the config's (``tools.retry``, ``tools.failBranch``);
    each replaces the decorator's for its tool. Fallbacks come when the answer is written
    (:mod:`workers.answering`).
    """
    started = job.submitted_ms
    try:
        spec = get_tool(job.call.name)
        arguments = validate_arguments(spec, job.call.arguments)
    except (ToolNotFound, InvalidArguments) as exc:
        return rejected_result(job.call, exc, clock_ms() - started)
    soft_end_ms = clock_ms() + int(job.soft_s * 1000)
    retry = rules.retries.get(spec.name, spec.retry)
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
        except MemoryError:
            raise  # out_of_memory, answered by the caller once the call's memory limit is lifted
        except Exception as exc:  # noqa: BLE001 - every tool failure becomes a result
            if ctx.cancel_settled():
                return cancelled_result(job.call, elapsed_ms=clock_ms() - started, attempt=attempt)
            if isinstance(exc, ToolCrashed):  # the process serving it died (an MCP upstream's)
                crashed = synthetic_result(
                    job.call,
                    SyntheticReason.CRASHED,
                    elapsed_ms=clock_ms() - started,
                    attempt=attempt,
                    detail=f": {exc}",
                )
                return settle_failure(
                    job,
                    ctx,
                    spec,
                    crashed,
                    rules=rules,
                    clock_ms=clock_ms,
                    interrupts=interrupts,
                    allows=allows,
                )
            if _retry_fits(retry, exc, attempt, soft_end_ms, clock_ms()):
                sleep(retry.delay_s(attempt))
                attempt += 1
                continue
            failure = tool_error_result(
                job.call, type(exc).__name__, str(exc), elapsed_ms=clock_ms() - started, attempt=attempt
            )
            return settle_failure(
                job, ctx, spec, failure, rules=rules, clock_ms=clock_ms, interrupts=interrupts, allows=allows
            )


def _retry_fits(retry: RetryPolicy, exc: Exception, attempt: int, soft_end_ms: int, now_ms: int) -> bool:
    return retry.should_retry(exc, attempt) and now_ms + retry.delay_s(attempt) * 1000 < soft_end_ms


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
