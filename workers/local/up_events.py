"""Status lines for ``unstuck up``: synthetic answers, loop verdicts, stalled work.

:class:`StreamWatcher` reads the events stream (``P:events``) that the ledger (every
synthetic answer that won), the gateways (loop warnings and blocks) and the watchdog
(sessions entering stalled or stuck) append to, so nothing is missed between polls.
:class:`DueWatcher` adds one thing the stream cannot say: a call still unanswered a grace
period past its deadline (are the watchdog and beat running?).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from workers.errors import StoreError
from workers.store.events import last_event_id, read_events
from workers.store.keys import parse_due_member
from workers.store.ledger import Ledger
from workers.store.ledger_scan import due_deadlines
from workers.store.records import CallField, EventField

__all__ = ["DueWatcher", "Event", "EventPrinter", "StreamWatcher"]

_COLOURS = {
    "synthetic": "\033[33m",
    "loop-warning": "\033[33m",
    "loop-critical": "\033[31m",
    "session.stalled": "\033[31m",
    "session.stuck": "\033[31m",
    "stalled": "\033[31m",
    "exited": "\033[31m",
    "started": "\033[32m",
}
_RESET = "\033[0m"


@dataclass(frozen=True)
class Event:
    """One significant thing that happened: ``kind`` plus its fields."""

    kind: str
    fields: Mapping[str, Any]


class StreamWatcher:
    """Follows the events stream from the moment it is created."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._last_id = "$"
        with contextlib.suppress(StoreError):
            self._resolve_start()

    def _resolve_start(self) -> None:
        """Pin "$" to the stream's current last id, so events between polls are never lost."""
        self._last_id = last_event_id(self._ledger)

    def poll(self, block_ms: int) -> list[Event]:
        """Events appended since the previous poll, waiting up to ``block_ms`` for the first."""
        if self._last_id == "$":
            self._resolve_start()
        events: list[Event] = []
        for entry_id, fields in read_events(self._ledger, self._last_id, block_ms=block_ms):
            self._last_id = entry_id
            kind = str(fields.pop(EventField.KIND, "event"))
            events.append(Event(kind, {k: _decode(v) for k, v in fields.items()}))
        return events


def _decode(value: Any) -> Any:
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return value


class DueWatcher:
    """Polls the due index for calls left unanswered past their deadline."""

    def __init__(self, ledger: Ledger, *, stalled_after_ms: int, report_answered: bool = True) -> None:
        self._report_answered = report_answered
        self._ledger = ledger
        self._stalled_after_ms = stalled_after_ms
        self._seen: dict[str, int] = {}
        self._stalled: set[str] = set()

    def poll(self, now_ms: int) -> list[Event]:
        """Events since the previous poll; raises ``StoreError`` when Redis fails."""
        current = due_deadlines(self._ledger)
        gone = self._seen.keys() - current.keys() if self._report_answered else set()
        events = [e for m in gone if (e := self._answered(m)) is not None]
        for member, deadline_ms in current.items():
            if member not in self._stalled and now_ms > deadline_ms + self._stalled_after_ms:
                self._stalled.add(member)
                events.append(self._stall(member, deadline_ms, now_ms))
        self._stalled &= current.keys()
        self._seen = current
        return events

    def _answered(self, member: str) -> Event | None:
        keys, call_id = parse_due_member(self._ledger.prefix, member)
        record = self._ledger.record(keys, call_id)
        if record is None or record.result is None or not record.result.synthetic:
            return None
        elapsed_ms = record.row.integer(CallField.FINISHED_MS) - record.row.integer(CallField.SUBMITTED_MS)
        return Event(
            "synthetic",
            {
                "session": keys.session_key,
                "run": keys.run_id,
                "call": call_id,
                "tool": record.tool,
                "reason": record.result.reason,
                "elapsed_s": round(elapsed_ms / 1000, 2),
                "writer": record.row.text(CallField.WRITER),
            },
        )

    def _stall(self, member: str, deadline_ms: int, now_ms: int) -> Event:
        keys, call_id = parse_due_member(self._ledger.prefix, member)
        return Event(
            "stalled",
            {
                "session": keys.session_key,
                "run": keys.run_id,
                "call": call_id,
                "past_deadline_s": round((now_ms - deadline_ms) / 1000, 1),
                "hint": "no result yet past its deadline; are the watchdog and beat running?",
            },
        )


class EventPrinter:
    """Writes events as readable lines (coloured on a terminal) or as JSON lines."""

    def __init__(self, out: TextIO, *, json_lines: bool, clock: Callable[[], float] = time.time) -> None:
        self._out = out
        self._json = json_lines
        self._colour = not json_lines and out.isatty()
        self._clock = clock

    def started(self, info: Mapping[str, Any], *, state_file: str) -> None:
        """The start-up banner: what runs where (one JSON event with ``--log-format json``)."""
        if self._json:
            self.emit("started", **info, state_file=state_file)
            return
        redis = f"{info['redis_url']}" + (
            f" (embedded, pid {info['redis_pid']})" if info["redis_embedded"] else ""
        )
        lines = [
            "unstuck up: running; Ctrl-C or SIGTERM stops everything.",
            f"  redis   {redis}",
            f"  worker  pid {info['worker_pid']} (prefork)",
            f"  watchdog pid {info['watchdog_pid']} (control queue)",
            f"  beat    pid {info['beat_pid']}",
            *([f"  api     {info['api_url']} (unstuck serve)"] if info.get("api_url") else []),
            *([f"  flower  {info['flower_url']}"] if info.get("flower_url") else []),
            f"  logs    {info['logs']}",
            f"  state   {state_file}",
        ]
        print("\n".join(lines), file=self._out, flush=True)

    def emit(self, kind: str, **fields: Any) -> None:
        """Print one event."""
        self.print(Event(kind, fields))

    def print(self, event: Event) -> None:
        """Print ``event`` in the chosen format and flush."""
        now = self._clock()
        if self._json:
            line = json.dumps({"ts": round(now, 3), "event": event.kind, **event.fields}, default=str)
        else:
            stamp = time.strftime("%H:%M:%S", time.localtime(now))
            label = f"{event.kind:<9}"
            if self._colour:
                label = f"{_COLOURS.get(event.kind, '')}{label}{_RESET}"
            details = "  ".join(f"{k}={v}" for k, v in event.fields.items() if v not in (None, ""))
            line = f"{stamp}  {label}  {details}"
        print(line, file=self._out, flush=True)
