"""What a failed call turns into: a default value (fallback) or an alternative tool (fail-branch).

Pure rules, read from config and the tools' decorators; the answering service
(:mod:`workers.answering`) applies the fallbacks when it writes an answer. A *fallback* turns
a failure result into a normal (non-error) result holding a declared value; its details
keep ``synthetic``, the failure's ``reason`` and say ``fallback: true``, so the model gets a
usable answer and operators still see what happened. A *fail-branch* names another tool to try once when the
first fails for chosen reasons; the one result says which branch answered.

Which failures qualify: the tool's own failures and unstuck's answers for a call that did
not finish (:data:`FALLBACK_REASONS`). Refusals (unknown tool, invalid arguments, a tool not
allowed, a loop block, an aborted run) never do: the model must change what it asks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from workers.core.models import RetryPolicy, SyntheticReason, ToolResult

__all__ = [
    "BRANCH_REASONS",
    "FALLBACK_REASONS",
    "NO_RULES",
    "BranchRule",
    "FailureRules",
    "FallbackRule",
    "branch_answer",
    "check_reasons",
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
