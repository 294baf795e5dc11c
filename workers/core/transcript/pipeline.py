"""The full replay repair for one provider's policy (stages in the order below)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from workers.core.transcript.ids import sanitize_tool_call_ids
from workers.core.transcript.model import ResultLookup
from workers.core.transcript.pairing import IdlessResults, repair_pairing
from workers.core.transcript.policy import TranscriptPolicy
from workers.core.transcript.report import PairingReport, RepairReport
from workers.core.transcript.sanitize import sanitize_tool_call_inputs, strip_result_details
from workers.core.transcript.turns import clean_blocks, fix_turn_order

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
    idless: IdlessResults = "legacy",
) -> RepairedTranscript:
    """Sanitise inputs and blocks, pair calls, sanitise ids, fix turn order, strip ``details``.

    Pairing runs before id sanitisation for every provider (OpenClaw does so for Responses APIs
    only): the ledger ``lookup`` is keyed by the ids the tools saw, and results that are already
    paired cannot be given invented orphan ids. A second pairing pass after the id rewrite runs
    only where the rewrite can move a result off its call (see ``_pairing_may_break``). Turn
    merges come last, as pairing and dropped turns are what leave two turns of one role side by
    side.
    """
    inputs = sanitize_tool_call_inputs(messages, allowed_tool_names=allowed_tool_names)
    current, cleaned = clean_blocks(
        inputs.messages,
        blank_texts=policy.sanitize_mode == "full",
        thinking=policy.drop_thinking_blocks,
        signatures=policy.sanitize_thought_signatures,
    )
    pairings: list[PairingReport] = []
    if policy.repair_tool_use_result_pairing:
        paired = repair_pairing(current, **_pairing_options(policy), lookup=lookup, idless=idless)
        current = paired.messages
        pairings.append(paired.report)
    ids_report = None
    if policy.sanitize_tool_call_ids and policy.tool_call_id_mode is not None:
        rewritten = sanitize_tool_call_ids(
            current,
            policy.tool_call_id_mode,
            preserve_anthropic_ids=policy.preserve_native_anthropic_tool_use_ids,
            keep_kimi_ids=policy.preserve_native_kimi_tool_call_ids,
        )
        ids_report = rewritten.report
        if rewritten.messages is not current and _pairing_may_break(policy, rewritten.invented_result_ids):
            again = repair_pairing(rewritten.messages, **_pairing_options(policy), idless=idless)
            pairings.append(again.report)
            current = again.messages
        else:
            current = rewritten.messages
    current, ordered = fix_turn_order(
        current,
        merge_assistants=policy.validate_gemini_turns,
        merge_users=policy.validate_anthropic_turns,
        user_first=policy.apply_google_turn_ordering,
    )
    stripped = strip_result_details(current) if strip_details else None
    report = RepairReport(
        inputs=inputs.report,
        pairing=tuple(pairings),
        ids=ids_report,
        stripped_details=stripped.stripped if stripped else 0,
        turns=cleaned + ordered,
    )
    return RepairedTranscript(stripped.messages if stripped else current, report)


def _pairing_may_break(policy: TranscriptPolicy, invented_result_ids: int) -> bool:
    # After pairing with failed turns dropped, every call has its one result right after its
    # turn, in call order, so the rewrite's first-in first-out per raw id gives each result its
    # own call's new id. A kept failed turn's unanswered calls, or a result the rewrite found no
    # call for, break that: then pairing runs again.
    if not policy.repair_tool_use_result_pairing:
        return False
    return policy.errored_turns == "preserve" or invented_result_ids > 0


def _pairing_options(policy: TranscriptPolicy) -> dict[str, Any]:
    return {
        "errored_turns": policy.errored_turns,
        "missing_text": policy.missing_tool_result_text,
        "allow_synthetic": policy.allow_synthetic_tool_results,
    }
