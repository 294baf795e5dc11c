"""The done-signal protocol: how the winning finish of a call wakes the waiters of its run.

The winning finish (``ledger_finish.lua``) pushes onto the run's ``done`` list a signal that
carries its result: ``<result JSON> US <call id>``, ``US`` being the ASCII unit separator
U+001F, so the waiter it wakes has the answer without reading the record. JSON never holds a
raw U+001F (RFC 8259 escapes control characters in strings), so the first one of a signal is
the separator, whatever the call id holds, and JSON never starts with :data:`HANDED_BACK`. A
signal without a separator carries no result: its waiter reads the record. A result carried
is used only when it parses as the answer to the call it names (:meth:`Signal.answer`), so an
odd signal costs at worst a read, never a wrong answer.

One signal is consumed per wake; leftovers only cause cheap extra wakes. Several waiters may
share a run (concurrent batches): a signal for a call not in a waiter's ``mine`` is handed
back once, behind :data:`HANDED_BACK`, so its own waiter (served first: Redis wakes blocked
clients in order) gets it at once instead of at its next check; a marked signal is never
handed back again, so a stale one cannot circulate. A sync waiter blocks on its own
connection (:meth:`workers.store.ledger.Ledger.wait_for_results`); asyncio waiters share one
per event loop (:class:`workers.store.done_listener.DoneListener`).

A handed-back signal goes to whichever waiter blocks first, which is not its own when that one
is between two waits (checking, or not scheduled on a busy machine). So a sync waiter also keeps
every signal it popped for another call in its process's :class:`Mailbox`, where the other
waiters of that process look before they block: without it, the call's own waiter learned the
answer only at its next check.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from workers.core.models import ToolResult
from workers.store.keys import REFRESH_INTERVAL_S

__all__ = [
    "HANDED_BACK",
    "KEYS_REFRESH_S",
    "SEPARATOR",
    "Mailbox",
    "Signal",
    "done_expire_s",
    "encode",
    "results_of",
]

#: Seconds between two refreshes of a run's calls/done TTLs (as the index keys' interval).
KEYS_REFRESH_S = REFRESH_INTERVAL_S
HANDED_BACK: Final = "\x00"  # marks a wake-up signal one waiter gave back to the run's other waiters
SEPARATOR: Final = "\x1f"  # between the result JSON and the call id ('\31' in ledger_finish.lua)


def done_expire_s(ttl_s: int) -> int:
    """The TTL a run's ``done`` list (and ``calls``) gets when it is set."""
    return ttl_s + 2 * KEYS_REFRESH_S


def encode(call_id: str, result_json: str) -> str:
    """The signal a winning finish pushes: the Python twin of ``ledger_finish.lua``'s."""
    return result_json + SEPARATOR + call_id


@dataclass(frozen=True)
class Signal:
    """One popped signal: its call, the result JSON it carries (None: none), and its form."""

    raw: str  # as popped, what a hand-back pushes again behind HANDED_BACK
    call_id: str
    result: str | None
    handed_back: bool

    @classmethod
    def parse(cls, raw: str) -> Signal:
        """Read a signal, handed back or not."""
        body = raw.removeprefix(HANDED_BACK)
        result, separator, call_id = body.partition(SEPARATOR)
        if not separator:
            return cls(raw, body, None, raw.startswith(HANDED_BACK))
        return cls(raw, call_id, result, raw.startswith(HANDED_BACK))

    def answer(self) -> ToolResult | None:
        """The result carried, when it is the answer to this signal's call."""
        if self.result is None:
            return None
        results = results_of({self.call_id: self.result})
        return None if results is None else results.get(self.call_id)

    def marked(self) -> str:
        """What a waiter pushes to hand this signal back to the run's other waiters."""
        return HANDED_BACK + self.raw


def results_of(stored: Mapping[str, str | None]) -> dict[str, ToolResult] | None:
    """The results among ``stored`` (call id -> JSON, or None when there is none yet).

    None when one of them is not its call's answer (an odd signal): its waiter reads the records.
    """
    results: dict[str, ToolResult] = {}
    for call_id, raw in stored.items():
        if not raw:
            continue
        try:
            result = ToolResult.from_json(raw)
        except ValueError:  # pydantic's ValidationError, for JSON that is no result
            return None
        if result.tool_call_id != call_id:
            return None
        results[call_id] = result
    return results


def stored_results(call_ids: Sequence[str], raw: Sequence[Any]) -> dict[str, ToolResult]:
    """The results read for ``call_ids`` (``HGET`` replies in the same order; empty: none yet)."""
    return {cid: ToolResult.from_json(r) for cid, r in zip(call_ids, raw, strict=True) if r}


#: Signals a process's mailbox keeps at most: beyond, the oldest go (their waiters' checks find
#: the answers), so stale signals of finished waits and large results cannot pile up.
MAILBOX_SIGNALS: Final = 256


class Mailbox:
    """Signals this process's sync waiters popped for one another, until their own waiter looks.

    Keyed by the run's ``done`` list and the call id. Thread-safe: the waiters of one ledger are
    threads.
    """

    def __init__(self, limit: int = MAILBOX_SIGNALS) -> None:
        self._limit = limit
        self._signals: OrderedDict[tuple[str, str], Signal] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, done_key: str, signal: Signal) -> None:
        """Keep ``signal`` (popped from ``done_key``) for its call's waiter."""
        with self._lock:
            self._signals[(done_key, signal.call_id)] = signal
            while len(self._signals) > self._limit:
                self._signals.popitem(last=False)

    def take(self, done_key: str, call_ids: Iterable[str]) -> dict[str, Signal]:
        """The kept signals of ``call_ids``, no longer kept."""
        with self._lock:
            if not self._signals:
                return {}
            found = {}
            for call_id in call_ids:
                signal = self._signals.pop((done_key, call_id), None)
                if signal is not None:
                    found[call_id] = signal
            return found
