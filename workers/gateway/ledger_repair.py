"""Transcript repair backed by the result ledger: fill a gap with what really happened."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workers.core.models import ToolResult
from workers.core.transcript import RepairedTranscript, repair_transcript, resolve_policy
from workers.core.transcript.adapters import decode, default_model_api, encode, idless_results
from workers.core.transcript.model import ResultLookup
from workers.errors import StoreError
from workers.settings import Settings
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger

__all__ = ["ledger_lookup", "repair_in_format", "repair_with_ledger"]


def _best(delivered: ToolResult | None, late: list[ToolResult]) -> ToolResult | None:
    # A real result that arrived late says more than the synthetic one delivered in time.
    real_late = next((r for r in late if not r.synthetic), None)
    if delivered is not None and delivered.synthetic and real_late is not None:
        return real_late
    return delivered or real_late


def ledger_lookup(ledger: Ledger, keys: RunKeys) -> ResultLookup:
    """A lookup for the pairing step: the ledger's result for a call id, in the neutral form."""

    def lookup(call_id: str, tool_name: str) -> Mapping[str, Any] | None:
        try:
            record = ledger.record(keys, call_id)
            late = ledger.late_results(keys, call_id)
        except StoreError:
            return None  # repair still works without the ledger: it synthesises instead
        best = _best(record.result if record else None, late)
        return best.to_neutral() if best is not None else None

    return lookup


def repair_with_ledger(
    ledger: Ledger,
    keys: RunKeys,
    settings: Settings,
    messages: Any,
    *,
    provider: str | None = None,
    model_api: str | None = None,
    model_id: str | None = None,
    fmt: str = "neutral",
) -> tuple[Any, RepairedTranscript]:
    """Repair ``messages`` (in ``fmt``) for the provider's policy, filling gaps from the ledger."""
    return repair_in_format(
        settings,
        messages,
        fmt=fmt,
        provider=provider,
        model_api=model_api,
        model_id=model_id,
        lookup=ledger_lookup(ledger, keys),
    )


def repair_in_format(
    settings: Settings,
    messages: Any,
    *,
    fmt: str = "neutral",
    provider: str | None = None,
    model_api: str | None = None,
    model_id: str | None = None,
    lookup: ResultLookup | None = None,
) -> tuple[Any, RepairedTranscript]:
    """Repair ``messages`` (in ``fmt``) for the provider's policy and settings' overrides.

    Raises:
        TranscriptRepairError: the transcript is malformed (``path`` points at the problem).
    """
    overrides = {**settings.transcript.policy_overrides.get("*", {})}
    overrides.update(settings.transcript.policy_overrides.get((provider or "").lower(), {}))
    policy = resolve_policy(provider, model_api or default_model_api(fmt), model_id, overrides or None)
    neutral = decode(fmt, messages)
    repaired = repair_transcript(neutral, policy, lookup=lookup, idless=idless_results(fmt))
    return encode(fmt, repaired.messages, messages), repaired
