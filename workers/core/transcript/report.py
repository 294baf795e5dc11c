"""What each repair step did, as frozen values with a JSON form for the CLI and logs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workers.core.transcript.model import Message

__all__ = ["IdReport", "InputReport", "PairingReport", "RepairReport", "TurnReport"]


@dataclass(frozen=True)
class InputReport:
    """Counts of input sanitisation."""

    dropped_tool_calls: int = 0
    dropped_assistant_messages: int = 0
    trimmed_names: int = 0

    def to_json(self) -> dict[str, Any]:
        """The camelCase JSON form."""
        return {
            "droppedToolCalls": self.dropped_tool_calls,
            "droppedAssistantMessages": self.dropped_assistant_messages,
            "trimmedNames": self.trimmed_names,
        }


@dataclass(frozen=True)
class IdReport:
    """Counts of tool-call id sanitisation and the old-to-new id of every call.

    ``dropped_item_ids`` counts Responses item ids dropped for repeating or lacking the ``fc`` prefix.
    """

    rewritten_call_ids: int = 0
    rewritten_result_ids: int = 0
    mapping: tuple[tuple[str, str], ...] = ()
    dropped_item_ids: int = 0

    def to_json(self) -> dict[str, Any]:
        """The camelCase JSON form."""
        return {
            "rewrittenCallIds": self.rewritten_call_ids,
            "rewrittenResultIds": self.rewritten_result_ids,
            "mapping": [list(pair) for pair in self.mapping],
            "droppedItemIds": self.dropped_item_ids,
        }


@dataclass(frozen=True)
class PairingReport:
    """The pairing report: synthetic results added, duplicates and orphans dropped, and more.

    ``unanswered`` lists the calls removed from their turn for want of a result when synthetic
    results are not allowed, as ``(id, name)``.
    """

    added: tuple[Message, ...] = ()
    dropped_duplicate_count: int = 0
    dropped_orphan_count: int = 0
    moved: bool = False
    discarded: tuple[Message, ...] = ()
    dropped_errored_turns: int = 0
    filled_from_lookup: tuple[Message, ...] = ()
    unanswered: tuple[tuple[str, str | None], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The camelCase JSON form."""
        return {
            "added": list(self.added),
            "droppedDuplicateCount": self.dropped_duplicate_count,
            "droppedOrphanCount": self.dropped_orphan_count,
            "moved": self.moved,
            "discarded": list(self.discarded),
            "droppedErroredTurns": self.dropped_errored_turns,
            "filledFromLookup": list(self.filled_from_lookup),
            "droppedUnansweredCalls": [{"id": call_id, "name": name} for call_id, name in self.unanswered],
        }


@dataclass(frozen=True)
class TurnReport:
    """What the turn-level fixes did: blocks dropped before pairing, turns merged or added after it."""

    dropped_blank_texts: int = 0
    dropped_thinking_blocks: int = 0
    dropped_signatures: int = 0
    dropped_empty_turns: int = 0
    merged_assistant_turns: int = 0
    merged_user_turns: int = 0
    added_bootstrap: bool = False

    @property
    def changed(self) -> bool:
        """Whether any turn or block changed."""
        return any(
            (
                self.dropped_blank_texts,
                self.dropped_thinking_blocks,
                self.dropped_signatures,
                self.dropped_empty_turns,
                self.merged_assistant_turns,
                self.merged_user_turns,
                self.added_bootstrap,
            )
        )

    def __add__(self, other: TurnReport) -> TurnReport:
        return TurnReport(
            self.dropped_blank_texts + other.dropped_blank_texts,
            self.dropped_thinking_blocks + other.dropped_thinking_blocks,
            self.dropped_signatures + other.dropped_signatures,
            self.dropped_empty_turns + other.dropped_empty_turns,
            self.merged_assistant_turns + other.merged_assistant_turns,
            self.merged_user_turns + other.merged_user_turns,
            self.added_bootstrap or other.added_bootstrap,
        )

    def to_json(self) -> dict[str, Any]:
        """The camelCase JSON form."""
        return {
            "droppedBlankTexts": self.dropped_blank_texts,
            "droppedThinkingBlocks": self.dropped_thinking_blocks,
            "droppedSignatures": self.dropped_signatures,
            "droppedEmptyTurns": self.dropped_empty_turns,
            "mergedAssistantTurns": self.merged_assistant_turns,
            "mergedUserTurns": self.merged_user_turns,
            "addedBootstrap": self.added_bootstrap,
        }


@dataclass(frozen=True)
class RepairReport:
    """Everything the full pipeline did; a step that did not run is None."""

    inputs: InputReport | None = None
    pairing: tuple[PairingReport, ...] = ()
    ids: IdReport | None = None
    stripped_details: int = 0
    turns: TurnReport = TurnReport()

    @property
    def changed(self) -> bool:
        """Whether any step changed the transcript."""
        ids = self.ids
        return any(report.moved for report in self.pairing) or bool(
            (self.inputs and (self.inputs.dropped_tool_calls or self.inputs.trimmed_names))
            or (ids and (ids.rewritten_call_ids or ids.rewritten_result_ids or ids.dropped_item_ids))
            or self.stripped_details
            or self.turns.changed
        )

    def to_json(self) -> dict[str, Any]:
        """The camelCase JSON form."""
        return {
            "inputs": self.inputs.to_json() if self.inputs else None,
            "pairing": [report.to_json() for report in self.pairing],
            "ids": self.ids.to_json() if self.ids else None,
            "strippedDetails": self.stripped_details,
            "turns": self.turns.to_json(),
            "changed": self.changed,
        }
