"""Reading the events stream (``P:events``) that :meth:`Ledger.publish_event` appends to.

Entries are returned as ``(id, fields)`` with the fields as stored; every function raises
``StoreError`` when Redis fails.
"""

from __future__ import annotations

from typing import Any

from workers.store.connection import store_errors
from workers.store.keys import events_stream_key
from workers.store.ledger import Ledger

__all__ = ["last_event_id", "read_events", "recent_events"]


def last_event_id(ledger: Ledger) -> str:
    """The id of the newest entry ever appended to the stream, ``"0-0"`` when there is no stream."""
    key = events_stream_key(ledger.prefix)
    with store_errors():
        info = ledger.client.xinfo_stream(key) if ledger.client.exists(key) else None
    return str(info["last-generated-id"]) if info else "0-0"


def read_events(
    ledger: Ledger, after_id: str, *, block_ms: int, count: int = 500
) -> list[tuple[str, dict[str, Any]]]:
    """Up to ``count`` entries after ``after_id``, waiting up to ``block_ms`` (at least 1) for the first."""
    key = events_stream_key(ledger.prefix)
    with store_errors():
        reply: Any = ledger.client.xread({key: after_id}, block=max(1, block_ms), count=count)
    return [
        (str(entry_id), {str(k): v for k, v in dict(raw).items()})
        for _stream, entries in reply or []
        for entry_id, raw in entries
    ]


def recent_events(ledger: Ledger, count: int) -> list[tuple[str, dict[str, Any]]]:
    """The newest ``count`` entries, oldest first."""
    key = events_stream_key(ledger.prefix)
    with store_errors():
        reply: Any = ledger.client.xrevrange(key, count=count)
    return [
        (str(entry_id), {str(k): v for k, v in dict(raw).items()}) for entry_id, raw in reversed(reply or [])
    ]
