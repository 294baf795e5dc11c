"""Build the results unstuck writes on the tool's behalf: the one place errors become data."""

from __future__ import annotations

import json
from typing import Any

from workers.core.models import SyntheticReason, TextBlock, ToolCall, ToolResult
from workers.errors import InvalidArguments, ToolNotFound

__all__ = [
    "answer_by_deadline",
    "deadline_result",
    "fallback_result",
    "not_allowed_result",
    "rejected_result",
    "render_value",
    "success_result",
    "synthetic_result",
    "tool_error_result",
]

_R = SyntheticReason

# Each text says what happened and what the model should do next, in one or two sentences.
_TEXTS: dict[SyntheticReason, str] = {
    _R.TIMEOUT_SOFT: "Tool '{tool}' was stopped after its time limit{of_limit}. "
    "Try a smaller or faster request, or a different approach.",
    _R.TIMEOUT_HARD: "Tool '{tool}' did not respond to its time limit{of_limit} and was killed. "
    "Do not retry it unchanged; try a smaller request or another tool.",
    _R.HEARTBEAT_TIMEOUT: "Tool '{tool}' stopped reporting progress{for_limit} and was stopped. "
    "It may be hung; try again later or use another approach.",
    _R.WORKER_LOST: "The worker running tool '{tool}' was lost (host died or was cut off) "
    "before it answered. Its effects are unknown: check before retrying.",
    _R.CRASHED: "Tool '{tool}' crashed (its process died{detail}). "
    "Its effects are unknown: check before retrying, or use a lighter request.",
    _R.OUT_OF_MEMORY: "Tool '{tool}' needed more memory than it may use{of_limit} and was stopped{detail}. "
    "Ask for less at once (a smaller range, fewer rows or fields, page through a large file or "
    "stream it) or take a lighter approach; the same request will fail the same way.",
    _R.INVALID_ARGUMENTS: "The arguments for tool '{tool}' are invalid: {detail}. "
    "Fix the arguments and call it again.",
    _R.UNKNOWN_TOOL: "Unknown tool: '{tool}'{detail}. Use one of the available tools.",
    _R.TOOL_NOT_ALLOWED: "Tool '{tool}' is not allowed for this agent{detail}; it did not run. "
    "Use one of the tools you were given.",
    _R.DISPATCH_FAILED: "Tool '{tool}' could not be started because the task queue is unavailable"
    "{detail}. It did not run; you may retry later.",
    _R.DEADLINE_EXCEEDED: "Tool '{tool}' did not finish before its deadline{of_limit}{detail}. "
    "Its effects are unknown: check before retrying.",
    _R.CANCELLED: "Tool '{tool}' was cancelled{detail}. It may not have run; do not assume it did.",
    _R.LOOP_BLOCKED: "{detail}",
    _R.RUN_ABORTED: "This run was aborted{detail}; tool '{tool}' was not run.",
    _R.CIRCUIT_OPEN: "Tool '{tool}' is failing for every session right now (its circuit is open{detail}); "
    "it was not run. Use another approach or try it later.",
    _R.CALL_MISMATCH: "The task message for tool '{tool}' did not match the call as it was registered "
    "(altered or forged in the queue){detail}; it did not run. Call the tool again if you still need it.",
    _R.STILL_RUNNING: "Tool '{tool}' is still running{detail}. It was not stopped and its result is kept: "
    "do not call it again.",
}


def _limit_clauses(limit_s: float | None, limit_mb: int | None) -> dict[str, str]:
    """Clauses naming the limit (" of 5s"), empty when it is unknown: never "a limit of its limit"."""
    if limit_mb is not None:
        return {"of_limit": f" (its limit is {limit_mb} MB)", "for_limit": ""}
    if limit_s is None:
        return {"of_limit": "", "for_limit": ""}
    return {"of_limit": f" of {limit_s:g}s", "for_limit": f" for {limit_s:g}s"}


def synthetic_result(
    call: ToolCall,
    reason: SyntheticReason,
    *,
    elapsed_ms: int,
    attempt: int,
    limit_s: float | None = None,
    detail: str = "",
    extra: dict[str, Any] | None = None,
    limit_mb: int | None = None,
) -> ToolResult:
    """A synthetic error result for ``call`` that tells the model what happened.

    Args:
        call: the call being answered.
        reason: why unstuck answers instead of the tool.
        elapsed_ms: time since the call was submitted.
        attempt: how many times the tool was started (0 if never).
        limit_s: the limit that expired, for timeout-like reasons.
        limit_mb: the memory limit that was exceeded (``out_of_memory``).
        detail: a short clause merged into the text (already phrased for the model).
        extra: more structured ``details`` fields.
    """
    text = _TEXTS.get(reason, "Tool '{tool}' failed: {detail}.").format(
        tool=call.name, detail=detail, **_limit_clauses(limit_s, limit_mb)
    )
    details: dict[str, Any] = {
        "synthetic": True,
        "reason": reason.value,
        "elapsed_ms": int(elapsed_ms),
        "attempt": int(attempt),
    }
    details.update(extra or {})
    return ToolResult(
        tool_call_id=call.id,
        tool_name=call.name,
        content=(TextBlock(text=text),),
        is_error=True,
        details=details,
    )


def tool_error_result(
    call: ToolCall, error_type: str, message: str, *, elapsed_ms: int, attempt: int
) -> ToolResult:
    """The result of a tool that raised: type and message, never a traceback."""
    text = f"Tool '{call.name}' failed with {error_type}: {message}"
    return ToolResult(
        tool_call_id=call.id,
        tool_name=call.name,
        content=(TextBlock(text=text[:4000]),),
        is_error=True,
        details={
            "synthetic": False,
            "reason": SyntheticReason.TOOL_ERROR.value,
            "error_type": error_type,
            "elapsed_ms": int(elapsed_ms),
            "attempt": int(attempt),
        },
    )


def render_value(value: object) -> str:
    """The text the model sees for a tool's return value."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)


def success_result(call: ToolCall, value: object, *, elapsed_ms: int, attempt: int) -> ToolResult:
    """The result of a tool that returned normally."""
    return ToolResult(
        tool_call_id=call.id,
        tool_name=call.name,
        content=(TextBlock(text=render_value(value)),),
        is_error=False,
        details={"synthetic": False, "elapsed_ms": int(elapsed_ms), "attempt": int(attempt)},
    )


def fallback_result(
    call: ToolCall, value: object, reason: SyntheticReason, *, elapsed_ms: int, attempt: int
) -> ToolResult:
    """A non-critical tool's declared fallback, returned as a normal result after it failed."""
    return ToolResult(
        tool_call_id=call.id,
        tool_name=call.name,
        content=(TextBlock(text=render_value(value)),),
        is_error=False,
        details={
            "synthetic": True,
            "fallback": True,
            "reason": reason.value,
            "elapsed_ms": int(elapsed_ms),
            "attempt": int(attempt),
        },
    )


def rejected_result(call: ToolCall, error: ToolNotFound | InvalidArguments, elapsed_ms: int) -> ToolResult:
    """The answer to a call that must not run: unknown tool or invalid arguments."""
    if isinstance(error, ToolNotFound):
        hint = f"; closest: {', '.join(error.closest)}" if error.closest else ""
        return synthetic_result(
            call, SyntheticReason.UNKNOWN_TOOL, elapsed_ms=elapsed_ms, attempt=0, detail=hint
        )
    return synthetic_result(
        call,
        SyntheticReason.INVALID_ARGUMENTS,
        elapsed_ms=elapsed_ms,
        attempt=0,
        detail="; ".join(error.problems),
        extra={"problems": error.problems},
    )


def not_allowed_result(call: ToolCall, agent_id: str, *, elapsed_ms: int, attempt: int) -> ToolResult:
    """The answer to a call of a tool the agent's allow/deny lists refuse; the tool did not run."""
    return synthetic_result(
        call,
        SyntheticReason.TOOL_NOT_ALLOWED,
        elapsed_ms=elapsed_ms,
        attempt=attempt,
        detail=f" ({agent_id!r})",
        extra={"agent_id": agent_id},
    )


def deadline_result(call: ToolCall, *, submitted_ms: int, deadline_ms: int) -> ToolResult:
    """The one answer to a call past its deadline: the same bytes whoever writes it.

    The gateway (answering locally while the store is unreachable), the watchdog, the
    gateway's own reaper and a worker that finishes too late all write exactly this, so what
    the agent was handed and what the ledger holds cannot differ. ``elapsed_ms`` is the
    call's whole budget and ``attempt`` is 0, because not every writer knows how often the
    tool started (the call's ledger record keeps the real count).
    """
    budget_ms = max(0, deadline_ms - submitted_ms)
    return synthetic_result(
        call, SyntheticReason.DEADLINE_EXCEEDED, elapsed_ms=budget_ms, attempt=0, limit_s=budget_ms / 1000
    )


def answer_by_deadline(
    result: ToolResult, call: ToolCall, *, submitted_ms: int, deadline_ms: int, now_ms: int
) -> ToolResult:
    """What a writer stores for ``call`` at ``now_ms``: ``result``, or the deadline result once past it.

    From its deadline on, a call may only be answered with :func:`deadline_result`: the
    gateway may already have handed exactly that to the agent while Redis was unreachable,
    and a late tool result must not make the ledger disagree with it (it is kept as late).
    """
    if now_ms < deadline_ms or result.reason == SyntheticReason.DEADLINE_EXCEEDED.value:
        return result
    return deadline_result(call, submitted_ms=submitted_ms, deadline_ms=deadline_ms)
