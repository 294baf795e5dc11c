"""The full replay repair for one provider's policy (spec §5 order)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from workers.core.transcript.ids import sanitize_tool_call_ids
from workers.core.transcript.model import ResultLookup
from workers.core.transcript.pairing import repair_pairing
from workers.core.transcript.policy import TranscriptPolicy
from workers.core.transcript.report import PairingReport, RepairReport
from workers.core.transcript.sanitize import sanitize_tool_call_inputs, strip_result_details

__all__ = ["RepairedTranscript", "repair_transcript"]


@dataclass(frozen=True)
class RepairedTranscript:
    """The repaired messages (the input list itself when nothing changed) and the full report."""

    messages: list[Any]
    report: RepairReport


def repair_transcript(
    messages: list[Any],
    policy: TranscriptPolicy,
    *,
    allowed_tool_names: Iterable[str] | None = None,
    lookup: ResultLookup | None = None,
    strip_details: bool = False,
) -> RepairedTranscript:
    """Sanitise inputs, pair calls with results, sanitise ids, and optionally strip ``details``.

    Pairing runs before id sanitisation for every provider (the spec does so for Responses APIs
    only): the ledger ``lookup`` is keyed by the ids the tools saw, and results that are already
    paired cannot be given invented orphan ids. A second pairing pass after the id rewrite is a
    safety net and changes nothing on a repaired transcript.
    """
    inputs = sanitize_tool_call_inputs(messages, allowed_tool_names=allowed_tool_names)
    current = inputs.messages
    pairings: list[PairingReport] = []
    if policy.repair_tool_use_result_pairing:
        paired = repair_pairing(current, **_pairing_options(policy), lookup=lookup)
        current = paired.messages
        pairings.append(paired.report)
    ids_report = None
    if policy.sanitize_tool_call_ids and policy.tool_call_id_mode is not None:
        rewritten = sanitize_tool_call_ids(
            current,
            policy.tool_call_id_mode,
            preserve_anthropic_ids=policy.preserve_native_anthropic_tool_use_ids,
        )
        ids_report = rewritten.report
        if rewritten.messages is not current and policy.repair_tool_use_result_pairing:
            again = repair_pairing(rewritten.messages, **_pairing_options(policy))
            pairings.append(again.report)
            current = again.messages
        else:
            current = rewritten.messages
    stripped = strip_result_details(current) if strip_details else None
    report = RepairReport(
        inputs=inputs.report,
        pairing=tuple(pairings),
        ids=ids_report,
        stripped_details=stripped.stripped if stripped else 0,
    )
    return RepairedTranscript(stripped.messages if stripped else current, report)


def _pairing_options(policy: TranscriptPolicy) -> dict[str, Any]:
    return {"errored_turns": policy.errored_turns, "missing_text": policy.missing_tool_result_text}
