"""What a failed call's answer becomes before it is written: the fallbacks, applied once, at write time.

Pure (no store): :class:`~workers.answering.service.Answers` applies them to every answer it
writes, and a gateway answering without a store hands on exactly what it would have written.
The rule types and the reasons a fallback may cover are the config's
(:mod:`workers.core.failure_policy`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from workers.core.failure_policy import FallbackRule
from workers.core.models import SyntheticReason, ToolCall, ToolResult
from workers.core.results import fallback_result

__all__ = ["SHARED_REASONS", "FallbackLookup", "apply_fallback", "delivered"]

FallbackLookup = Callable[[str], FallbackRule | None]
"""The fallback rule of a tool by its name (None: none), as one process knows them."""


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


#: Answers any process may write for a call (the gateway, the watchdog, a door, the worker):
#: only ``tools.fallbacks``, which every process reads, may replace them, so that whoever
#: writes one stores the same bytes (a gateway may have handed one on while Redis was down).
SHARED_REASONS: Final = frozenset({SyntheticReason.DEADLINE_EXCEEDED.value, SyntheticReason.CANCELLED.value})


def delivered(
    result: ToolResult, fallbacks: Mapping[str, FallbackRule], declared: FallbackLookup | None = None
) -> ToolResult:
    """What the agent is given for ``result``: the tool's fallback applied where one covers it.

    ``fallbacks``: ``tools.fallbacks``, which win. ``declared``: the fallbacks tools declare
    in their decorators, known only where tools run (the worker); never applied to an
    answer of :data:`SHARED_REASONS`.
    """
    rule = fallbacks.get(result.tool_name)
    if rule is None and declared is not None and result.reason not in SHARED_REASONS:
        rule = declared(result.tool_name)
    return apply_fallback(result, rule)
