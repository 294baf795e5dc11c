"""Cancel requests on call records: the mark a gateway or operator sets, and what workers read.

The mark (``CallField.CANCEL_MS``) is set only on unanswered calls and only once
(``ledger_cancel.lua``); the answer itself is written through :meth:`Ledger.finish`, first
writer wins, by whoever gets there first: the gateway for a call no worker holds, the
tool's worker (with its partial output) or its main process once the grace is over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from workers.core.models import CallState
from workers.errors import StoreError
from workers.store.connection import store_errors
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger
from workers.store.lua import load_script
from workers.store.records import CallField

__all__ = ["CancelMarks", "CancelRequest"]


@dataclass(frozen=True)
class CancelRequest:
    """A call a cancel request reached: its state then, and when the first request came."""

    call_id: str
    state: CallState
    requested_ms: int


class CancelMarks:
    """Set and read cancel marks; every method raises ``StoreError`` when Redis fails."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._request = load_script(ledger.client, "ledger_cancel.lua")

    def request(self, keys: RunKeys, call_ids: Sequence[str], *, now_ms: int) -> list[CancelRequest]:
        """Mark the unanswered ones among ``call_ids``; answered or unknown calls are left out."""
        if not call_ids:
            return []
        with store_errors():
            replies = self._request(keys=[keys.call(cid) for cid in call_ids], args=[now_ms])
        found = []
        for call_id, (state, requested) in zip(call_ids, replies, strict=True):
            if not state:
                continue
            try:
                found.append(CancelRequest(call_id, CallState(str(state)), int(requested)))
            except ValueError:
                raise StoreError(f"ledger_cancel.lua returned {state!r} for {call_id}") from None
        return found

    def requested(self, calls: Sequence[tuple[RunKeys, str]]) -> list[int]:
        """When a cancel of each call was first requested (0: never), in one round trip."""
        if not calls:
            return []
        with store_errors():
            pipe = self.ledger.client.pipeline(transaction=False)
            for keys, call_id in calls:
                pipe.hget(keys.call(call_id), CallField.CANCEL_MS)
            replies = pipe.execute()
        return [int(reply) if reply and str(reply).isdigit() else 0 for reply in replies]
