"""The result ledger: one record per tool call, first-writer-wins results, leases, heartbeats.

One ledger on two clients: :class:`Ledger` on ``redis.Redis`` (workers, the watchdog, sync
gateways) and :class:`AsyncLedger` on ``redis.asyncio`` (asyncio gateways; a waiter blocked
there holds a connection, not a thread). Every operation but the wait is written once, in
:mod:`workers.store._async.ledger_client`, and the sync client is generated from it
(``make generate``), so both send the same commands in the same round trips; the operations
themselves are :mod:`workers.store.ledger_ops`, the done signals that wake a waiter
:mod:`workers.store.done_signals`. What differs is how each waits: a sync waiter blocks on
its own connection, asyncio waiters share one per event loop
(:class:`workers.store.done_listener.DoneListener`).

A client of :class:`AsyncLedger` belongs to the event loop it was first used on: open one per
loop (``workers.runtime.open_async_ledger``), and ``await aclose()`` it before that loop ends.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

import redis.asyncio as aredis

from workers.core.models import ToolResult
from workers.store._async.ledger_client import AsyncLedgerClient
from workers.store._sync.ledger_client import LedgerClient
from workers.store.claims import Claim
from workers.store.connection import store_errors
from workers.store.done_signals import (
    HANDED_BACK,
    KEYS_REFRESH_S,
    SEPARATOR,
    Mailbox,
    Signal,
    done_expire_s,
    encode,
    results_of,
    stored_results,
)
from workers.store.keys import RunKeys
from workers.store.ledger_ops import Registration
from workers.store.records import CallField
from workers.store.replica_acks import ReplicaAcks


class _Listener(Protocol):
    """What :class:`AsyncLedger` needs of :class:`workers.store.done_listener.DoneListener`."""

    async def wait_reading(
        self,
        done_key: str,
        timeout_s: float,
        *,
        mine: Collection[str] = (),
        reads: Mapping[str, str] | None = None,
    ) -> dict[str, str | None] | bool | None: ...

    async def aclose(self) -> None: ...


__all__ = [
    "HANDED_BACK",
    "KEYS_REFRESH_S",
    "SEPARATOR",
    "AsyncLedger",
    "Claim",
    "Ledger",
    "Registration",
    "Signal",
    "done_expire_s",
    "encode",
    "results_of",
]


class Ledger(LedgerClient):
    """The ledger on a sync client. All methods raise ``StoreError`` when Redis fails."""

    #: The longest ``BLPOP`` this ledger sends (None: as long as asked), set by ``open_ledger``
    #: to half the socket timeout. A ``BLPOP`` the socket gives up on first fails the wait as
    #: a store error, and a signal Redis pops just then goes to a closed connection and is lost:
    #: its waiter learns the answer only at its next check.
    max_block_s: float | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Signals this process's waiters popped for one another (see :mod:`~workers.store.done_signals`).
        self.mailbox = Mailbox()

    def wait_for_results(
        self, keys: RunKeys, timeout_s: float, *, mine: Collection[str] = (), read: Sequence[str] = ()
    ) -> dict[str, ToolResult] | None:
        """Block up to ``timeout_s`` (``max_block_s`` at most) for the next done signal; read ``read``.

        None when no signal came in that time. A signal for a call not in ``mine`` is handed
        back once (see :mod:`workers.store.done_signals`). One ``BLPOP`` on the run's done list; the
        signal of the winning finish carries its result, so for one call nothing is read behind
        it: its own signal is its answer, and after any other the record is read in the round
        trip that may hand that signal back. For several calls the reads are pipelined behind
        the ``BLPOP`` on its connection, so Redis runs them the moment the signal is popped.
        A signal another waiter of this process popped for ``read`` answers first, from the
        mailbox, without blocking.
        """
        mailed = self.mailbox.take(keys.done, read)
        if mailed:
            return self._mailed(keys, read, mailed)
        behind = read if len(read) > 1 else ()
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            if self.max_block_s is not None:
                timeout_s = min(timeout_s, self.max_block_s)
            pipe.blpop([keys.done], timeout=max(0.01, timeout_s))
            for call_id in behind:
                pipe.hget(keys.call(call_id), CallField.RESULT)
            popped, *raw = pipe.execute()
            if popped is None:
                return None
            signal = Signal.parse(str(popped[1]))
            if mine and signal.call_id not in mine:
                self.mailbox.put(keys.done, signal)  # for its own waiter, should it not block first
            else:
                self.mailbox.take(keys.done, [signal.call_id])  # kept by another waiter: not needed
            answers = stored_results(behind, raw)
            if signal.call_id in read and (inline := signal.answer()) is not None:
                answers[signal.call_id] = inline
            follow = [] if behind else [cid for cid in read if cid not in answers]
            answers.update(self._after_signal(keys, signal, mine, follow))
        # What the signal carried may not be on a replica yet: re-read it, confirmed.
        return self.results(keys, read) if read and self.replica_acks.fencing else self.handed(keys, answers)

    def _mailed(
        self, keys: RunKeys, read: Sequence[str], mailed: Mapping[str, Signal]
    ) -> dict[str, ToolResult]:
        """The answers another waiter of this process popped for ``read``, in one round trip.

        The copy it handed back is taken off the run's list (the other waiters would only pop
        it for nothing); a signal that carries no result has its record read.
        """
        answers = {
            call_id: answer for call_id, signal in mailed.items() if (answer := signal.answer()) is not None
        }
        unread = [call_id for call_id in mailed if call_id not in answers]
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for signal in mailed.values():
                if not signal.handed_back:  # the waiter that kept it handed it back, marked
                    pipe.lrem(keys.done, 1, signal.marked())
            for call_id in unread:
                pipe.hget(keys.call(call_id), CallField.RESULT)
            replies = pipe.execute()
        answers.update(stored_results(unread, replies[len(replies) - len(unread) :]))
        return self.results(keys, read) if self.replica_acks.fencing else self.handed(keys, answers)

    def _after_signal(
        self, keys: RunKeys, signal: Signal, mine: Collection[str], follow: Sequence[str]
    ) -> dict[str, ToolResult]:
        """Hand ``signal`` back if it is not for ``mine``, and read ``follow``: one round trip."""
        hand_back = bool(mine) and not signal.handed_back and signal.call_id not in mine
        if not hand_back and not follow:
            return {}
        pipe = self.client.pipeline(transaction=False)
        if hand_back:
            # The pop may have emptied (deleted) the list: a push that creates it sets its TTL.
            pipe.rpush(keys.done, signal.marked())
            pipe.expire(keys.done, done_expire_s(self.ttl_s))
        for call_id in follow:
            pipe.hget(keys.call(call_id), CallField.RESULT)
        replies = pipe.execute()
        return stored_results(follow, replies[len(replies) - len(follow) :])


class AsyncLedger(AsyncLedgerClient):
    """The ledger on an asyncio client: what an asyncio gateway needs. All methods raise ``StoreError``.

    Registrations have a client of their own (``registering``, default: ``client``): with
    hundreds of batches waiting on one loop, their checks keep every connection of ``client``
    busy, and a registration queued behind them could outwait the pool's timeout and leave
    its call unsubmitted (``dispatch_failed``) with Redis healthy. ``registering_slots`` is how
    many registrations its pool serves at once.
    """

    def __init__(
        self,
        client: aredis.Redis,
        *,
        prefix: str,
        ttl_s: int,
        listener: _Listener,
        registering: aredis.Redis | None = None,
        lease_ttl_ms: int = 0,
        replica_acks: ReplicaAcks | None = None,
    ) -> None:
        super().__init__(
            client,
            prefix=prefix,
            ttl_s=ttl_s,
            lease_ttl_ms=lease_ttl_ms,
            replica_acks=replica_acks,
            registering=registering,
        )
        pool = getattr(self.registering, "connection_pool", None)  # a cluster client has none
        self.registering_slots = int(getattr(pool, "max_connections", 1))
        self._listener = listener

    async def aclose(self) -> None:
        """Close the clients' connections and the listener's (on the loop they belong to)."""
        await self._listener.aclose()
        await super().aclose()

    async def wait_for_results(
        self, keys: RunKeys, timeout_s: float, *, mine: Collection[str] = (), read: Sequence[str] = ()
    ) -> dict[str, ToolResult] | None:
        """:meth:`Ledger.wait_for_results`, on the loop's one listening connection (``DoneListener``).

        One call's answer usually comes with its signal, and the listener reads several behind
        its ``BLPOP`` while few calls are waited on; otherwise they take one more round trip.
        """
        woke = await self._listener.wait_reading(
            keys.done, timeout_s, mine=mine, reads={call_id: keys.call(call_id) for call_id in read}
        )
        if woke is None:
            return None
        learned = None if isinstance(woke, bool) else results_of(woke)
        # Woken without them (or with a result that is not its call's), or with results that may
        # not be on a replica yet: re-read them (confirmed).
        if learned is None or self.replica_acks.fencing:
            return await self.results(keys, read)
        return self.handed(keys, learned)
