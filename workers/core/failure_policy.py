"""What a failed call turns into: a default value (fallback) or an alternative tool (fail-branch).

Pure rules, shared by every writer of results. A *fallback* turns a failure result into a
normal (non-error) result holding a declared value; its details keep ``synthetic``, the
failure's ``reason`` and say ``fallback: true``, so the model gets a usable answer and
operators still see what happened. A *fail-branch* names another tool to try once when the
first fails for chosen reasons; the one result says which branch answered.

Which failures qualify: the tool's own failures and unstuck's answers for a call that did
not finish (:data:`FALLBACK_REASONS`). Refusals (unknown tool, invalid arguments, a tool not
allowed, a loop block, an aborted run) never do: the model must change what it asks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from workers.core.models import RetryPolicy, SyntheticReason, ToolCall, ToolResult
from workers.core.results import fallback_result

__all__ = [
    "BRANCH_REASONS",
    "FALLBACK_REASONS",
    "NO_RULES",
    "BranchRule",
    "FailureRules",
    "FallbackRule",
    "apply_fallback",
    "branch_answer",
    "check_reasons",
    "delivered",
]

_R = SyntheticReason

#: Failures a fallback may answer: the tool failed, the call did not finish, or its tool's
#: shared circuit breaker is open (answered at once, with the fallback if one is set).
FALLBACK_REASONS: Final = frozenset(
    {
        _R.TOOL_ERROR,
        _R.TIMEOUT_SOFT,
        _R.TIMEOUT_HARD,
        _R.HEARTBEAT_TIMEOUT,
        _R.WORKER_LOST,
        _R.CRASHED,
        _R.OUT_OF_MEMORY,
        _R.DISPATCH_FAILED,
        _R.DEADLINE_EXCEEDED,
        _R.CANCELLED,
        _R.CIRCUIT_OPEN,
    }
)

#: Failures after which the worker itself can still run another tool inside the call's time.
BRANCH_REASONS: Final = frozenset({_R.TOOL_ERROR, _R.TIMEOUT_SOFT})


def check_reasons(reasons: Iterable[str], allowed: frozenset[SyntheticReason]) -> tuple[SyntheticReason, ...]:
    """``reasons`` as enum values; raises ``ValueError`` naming any reason outside ``allowed``."""
    out: list[SyntheticReason] = []
    for reason in reasons:
        if reason not in {r.value for r in allowed}:
            choices = ", ".join(sorted(r.value for r in allowed))
            raise ValueError(f"reason {reason!r} is not one of: {choices}")
        out.append(SyntheticReason(reason))
    return tuple(out)


@dataclass(frozen=True)
class FallbackRule:
    """A default value for a tool's failures; ``reasons`` empty means every qualifying reason."""

    value: Any
    reasons: tuple[SyntheticReason, ...] = ()

    def covers(self, reason: str | None) -> bool:
        """Whether a failure for ``reason`` is answered with the value."""
        if reason is None or reason not in {r.value for r in FALLBACK_REASONS}:
            return False
        return not self.reasons or reason in {r.value for r in self.reasons}


@dataclass(frozen=True)
class BranchRule:
    """Another tool tried once, with the same arguments, when the first fails for ``reasons``."""

    tool: str
    reasons: tuple[SyntheticReason, ...] = (_R.TOOL_ERROR, _R.TIMEOUT_SOFT)

    def covers(self, reason: str | None) -> bool:
        """Whether a failure for ``reason`` is retried with the branch tool."""
        return reason is not None and reason in {r.value for r in self.reasons}


@dataclass(frozen=True)
class FailureRules:
    """Per-tool rules from config (``tools.fallbacks``, ``tools.failBranch``, ``tools.retry``)."""

    fallbacks: Mapping[str, FallbackRule] = field(default_factory=dict)
    branches: Mapping[str, BranchRule] = field(default_factory=dict)
    retries: Mapping[str, RetryPolicy] = field(default_factory=dict)


NO_RULES: Final = FailureRules()


def apply_fallback(result: ToolResult, rule: FallbackRule | None) -> ToolResult:
    """``result``, or the rule's value as a normal result when ``result`` is a failure it covers.

    Deterministic (the same failure gives the same bytes whoever applies it) and idempotent
    (a fallback result is not an error, so it is never replaced twice).
    """
    if rule is None or not result.is_error or not rule.covers(result.reason):
        return result
    answer = fallback_result(
        ToolCall(id=result.tool_call_id, name=result.tool_name),
        rule.value,
        SyntheticReason(str(result.reason)),
        elapsed_ms=int(result.details.get("elapsed_ms", 0)),
        attempt=int(result.details.get("attempt", 0)),
    )
    # The failure's own facts stay (error_type, a cancelled tool's partial, retry_after_s, the
    # branch that answered); the fallback's keys say what the model got instead.
    return answer.model_copy(update={"details": {**result.details, **answer.details}})


def delivered(result: ToolResult, fallbacks: Mapping[str, FallbackRule]) -> ToolResult:
    """What the agent is given for ``result``: the one place ``tools.fallbacks`` is applied.

    Every writer composes its answer with this before handing it to the ledger, which stores
    what it is given: the worker, the gateway (its own answers, reaped and local ones), the
    watchdog, a cancel and the MCP door store the same bytes for the same failure, so the
    agent is given what the ledger holds.
    """
    return apply_fallback(result, fallbacks.get(result.tool_name))


def branch_answer(first: ToolResult, branch: ToolResult, branch_tool: str) -> ToolResult:
    """The one result of a call answered by its fail-branch: the branch's outcome, named.

    The result keeps the original call's id and tool name (the transcript pairs it with the
    call the model made); ``answered_by`` names the branch tool, ``branch_reason`` why the
    first failed, and ``first_error`` what it said.
    """
    details: dict[str, Any] = dict(branch.details)
    details.update(
        {
            "answered_by": branch_tool,
            "branch_reason": first.reason,
            "first_error": first.text[:500],
            "elapsed_ms": branch.details.get("elapsed_ms", first.details.get("elapsed_ms", 0)),
        }
    )
    return branch.model_copy(
        update={"tool_call_id": first.tool_call_id, "tool_name": first.tool_name, "details": details}
    )
