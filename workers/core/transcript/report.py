"""What each repair step did, as frozen values with a JSON form for the CLI and logs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workers.core.transcript.model import Message

__all__ = ["IdReport", "InputReport", "PairingReport", "RepairReport"]


@dataclass(frozen=True)
class InputReport:
    """Counts of input sanitisation (spec §2.2)."""

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
    """Counts of tool-call id sanitisation (spec §2.5) and the old-to-new id of every call."""

    rewritten_call_ids: int = 0
    rewritten_result_ids: int = 0
    mapping: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The camelCase JSON form."""
        return {
            "rewrittenCallIds": self.rewritten_call_ids,
            "rewrittenResultIds": self.rewritten_result_ids,
            "mapping": [list(pair) for pair in self.mapping],
        }


@dataclass(frozen=True)
class PairingReport:
    """The §2.3.5 report: synthetic results added, duplicates and orphans dropped, and more."""

    added: tuple[Message, ...] = ()
    dropped_duplicate_count: int = 0
    dropped_orphan_count: int = 0
    moved: bool = False
    discarded: tuple[Message, ...] = ()
    dropped_errored_turns: int = 0
    filled_from_lookup: tuple[Message, ...] = ()

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
        }


@dataclass(frozen=True)
class RepairReport:
    """Everything the full pipeline did; a step that did not run is None."""

    inputs: InputReport | None = None
    pairing: tuple[PairingReport, ...] = ()
    ids: IdReport | None = None
    stripped_details: int = 0

    @property
    def changed(self) -> bool:
        """Whether any step changed the transcript."""
        return any(report.moved for report in self.pairing) or bool(
            (self.inputs and (self.inputs.dropped_tool_calls or self.inputs.trimmed_names))
            or (self.ids and (self.ids.rewritten_call_ids or self.ids.rewritten_result_ids))
            or self.stripped_details
        )

    def to_json(self) -> dict[str, Any]:
        """The camelCase JSON form."""
        return {
            "inputs": self.inputs.to_json() if self.inputs else None,
            "pairing": [report.to_json() for report in self.pairing],
            "ids": self.ids.to_json() if self.ids else None,
            "strippedDetails": self.stripped_details,
            "changed": self.changed,
        }
