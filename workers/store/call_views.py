"""What the sync and async ledgers share about reading calls and telling of answers.

The fields of an unanswered call the gateway and the watchdog read (``ledger_open.lua``), the
:class:`~workers.core.waiting.OpenCall` built from them, and the two things every first-stored
answer sets off: the ``synthetic`` event and the ``on_answered`` listeners. One copy, so the
two ledgers cannot drift apart.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workers.core.models import CallState, ToolResult
from workers.core.waiting import OpenCall
from workers.store.keys import RunKeys
from workers.store.records import CALL, CallField, EventField
from workers.store.rows import Row

__all__ = ["OPEN_FIELDS", "CallRecord", "announce", "event_entry", "open_call", "synthetic_event_fields"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallRecord:
    """A call as the ledger holds it; ``fields`` as stored, ``row`` to read them by declared name."""

    call_id: str
    tool: str
    state: CallState
    result: ToolResult | None
    fields: dict[str, str]

    @property
    def row(self) -> Row[CallField]:
        """The stored fields with their declared types and defaults."""
        return Row(CALL, self.fields)

    @classmethod
    def of(cls, keys: RunKeys, call_id: str, fields: dict[str, str]) -> CallRecord | None:
        """The record a call's stored hash holds; None when it holds nothing (never written, expired)."""
        if not fields:
            return None
        row = Row(CALL, fields, where=keys.call(call_id))
        stored = row.raw(CallField.RESULT)
        result = ToolResult.from_json(stored) if stored is not None else None
        state = row.member(CallField.STATE, CallState)
        return cls(call_id, row.text(CallField.TOOL), state, result, fields)


# What the gateway and watchdog need of an unanswered call (ledger_open.lua reads these).
OPEN_FIELDS = (
    CallField.CALL_ID, CallField.STATE, CallField.DEADLINE_MS, CallField.ATTEMPT, CallField.IDEMPOTENT,
    CallField.DISPATCHED, CallField.SUBMITTED_MS, CallField.TOOL, CallField.QUEUED_MS,
    CallField.REPUBLISHES,
)  # fmt: skip


def open_call(row: Row[CallField], lease_alive: bool) -> OpenCall:
    """The :class:`OpenCall` an :data:`OPEN_FIELDS` row describes."""
    return OpenCall(
        call_id=row.text(CallField.CALL_ID),
        tool=row.text(CallField.TOOL),
        state=row.member(CallField.STATE, CallState),
        deadline_ms=row.integer(CallField.DEADLINE_MS),
        attempt=row.integer(CallField.ATTEMPT),
        lease_alive=lease_alive,
        idempotent=row.flag(CallField.IDEMPOTENT),
        dispatched=row.flag(CallField.DISPATCHED),
        submitted_ms=row.integer(CallField.SUBMITTED_MS),
        queued_ms=row.maybe_integer(CallField.QUEUED_MS),
        republishes=row.integer(CallField.REPUBLISHES),
    )


def synthetic_event_fields(keys: RunKeys, result: ToolResult, writer: str) -> dict[str, Any]:
    """The fields of the ``synthetic`` event a writer publishes when its synthetic answer won."""
    return dict(  # keywords, as publish_event takes them: no field literals in the store
        session=keys.session_key,
        run=keys.run_id,
        call=result.tool_call_id,
        tool=result.tool_name,
        reason=result.reason or "",
        writer=writer,
        elapsed_s=round(int(result.details.get("elapsed_ms", 0)) / 1000, 2),
    )


def event_entry(kind: str, fields: dict[str, Any]) -> dict[str, str]:
    """An events-stream entry: the kind, and every other field as a string (JSON when not one)."""
    return {
        EventField.KIND: kind,
        **{k: v if isinstance(v, str) else json.dumps(v) for k, v in fields.items()},
    }


def announce(
    listeners: Sequence[Callable[[RunKeys, ToolResult], None]], keys: RunKeys, result: ToolResult
) -> None:
    """Tell ``listeners`` that ``result`` was stored first; a listener never fails the write."""
    for listener in listeners:
        try:
            listener(keys, result)
        except Exception as exc:  # noqa: BLE001 - a listener never makes a stored answer fail
            log.warning("answer listener failed for call %s: %s", result.tool_call_id, exc)
