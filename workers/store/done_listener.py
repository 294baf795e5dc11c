"""One blocking connection per event loop that waits for the answer signals of every waiting run.

A waiter per connection does not scale: a thousand waiting batches would open a thousand
connections (each connect costs the event loop about a millisecond) and re-issue a
thousand ``BLPOP`` s per check. Here one task issues one ``BLPOP`` over the ``done`` lists of
all runs waited on in this loop, plus a poke list of its own (``listener_poke_key``) that a
new run's first waiter pushes to, so the ``BLPOP`` is re-issued with that run's list at once.

The signals follow the protocol of :mod:`workers.store.ledger` (its docstring), shared
with sync waiters in other processes: a signal for a call no local waiter owns is handed back
once, marked; a marked signal is never handed back again. A signal popped while its run's
waiter is between two waits is kept for that waiter's next wait.

The signal of the winning finish carries its result (:mod:`workers.store.ledger`): a
waiter of one call woken by that call's signal has its answer with it, and nothing is read
for it behind the ``BLPOP``. Woken by any other signal (another call's, or a marked one), it
reads its call itself, at once. The results of waiters of several
calls are read in the same round trip, pipelined behind the ``BLPOP`` (as
:meth:`workers.store.ledger.Ledger.wait_for_results` does) while few are waited on: a woken
waiter then has its answers without another round trip.

Multi-key ``BLPOP`` needs the ``done`` lists on one node: a single Redis, as the ledger's
client (``redis.Redis``) is. :func:`workers.store.connection.aconnect` opens the asyncio
clients, the listener's and the :class:`~workers.store.ledger.AsyncLedger`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aredis

from workers.errors import StoreError
from workers.store.keys import listener_poke_key
from workers.store.ledger import Signal, done_expire_s
from workers.store.records import CallField
from workers.store.redis_errors import store_error_of

__all__ = ["DoneListener"]

log = logging.getLogger(__name__)

_POKE_TTL_S = 60
_KEEP_UNCLAIMED_S = 10.0  # a signal popped between two waits of its run's waiter
# Results read behind one BLPOP at most; past that (many waiting runs) waiters read their own.
_MAX_READS = 32


@dataclass(eq=False)  # hashed by identity: the key of its reads in ``_read_by_waiter``
class _Waiting:
    mine: frozenset[str]
    reads: dict[str, str]  # call id -> the key of its call record
    # The results it learned with the signal that woke it, read behind it or carried by it
    # (call id -> stored JSON, or None when none yet), or None when it must read them itself.
    woken: asyncio.Future[dict[str, str | None] | None]


@dataclass
class _Kept:
    signals: list[str] = field(default_factory=list)
    since: float = field(default_factory=time.monotonic)


class DoneListener:
    """Waits for answer signals of many runs on one connection (see the module docstring)."""

    def __init__(
        self, blocking: aredis.Redis, quick: aredis.Redis, *, prefix: str, listen_s: float, ttl_s: int
    ) -> None:
        self._blocking = blocking  # only ever used by the listening task
        self._quick = quick
        self._done_expire_s = done_expire_s(ttl_s)  # ttl_s: ledger.ttl_s
        self._poke_key = listener_poke_key(prefix, uuid.uuid4().hex)
        self._listen_s = listen_s
        self._waiters: dict[str, list[_Waiting]] = {}
        self._kept: dict[str, _Kept] = {}
        self._listening: frozenset[str] = frozenset()
        self._poked = False  # a poke is on its way: the next BLPOP takes every new run at once
        self._task: asyncio.Task[None] | None = None

    async def wait_reading(
        self,
        done_key: str,
        timeout_s: float,
        *,
        mine: Collection[str] = (),
        reads: Mapping[str, str] | None = None,
    ) -> dict[str, str | None] | bool | None:
        """Wait up to ``timeout_s`` for a signal on ``done_key``, reading ``reads`` behind it if it can.

        ``reads``: call id -> its record key. None when no signal came; the stored results of
        ``reads`` (JSON, or None) when they were read behind it; True when a signal came without them.
        """
        if await self._claim_kept(done_key, frozenset(mine)):
            return True
        waiting = _Waiting(frozenset(mine), dict(reads or {}), asyncio.get_running_loop().create_future())
        self._waiters.setdefault(done_key, []).append(waiting)
        try:
            await self._listen_to(done_key)
            read = await asyncio.wait_for(waiting.woken, timeout=max(0.01, timeout_s))
            return True if read is None else read
        except TimeoutError:
            return None
        finally:
            self._waiters[done_key].remove(waiting)
            if not self._waiters[done_key]:
                del self._waiters[done_key]

    async def aclose(self) -> None:
        """Stop listening and close the blocking connection."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._blocking.aclose()

    async def _listen_to(self, done_key: str) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._listen())
        elif done_key not in self._listening and not self._poked:
            self._poked = True
            try:
                pipe = self._quick.pipeline(transaction=False)
                pipe.rpush(self._poke_key, "1")
                pipe.expire(self._poke_key, _POKE_TTL_S)
                await pipe.execute()
            except redis.RedisError as exc:
                raise store_error_of(exc) from exc

    async def _listen(self) -> None:
        while self._anyone_unwoken():
            self._forget_old_kept()
            self._poked = False
            keys = [self._poke_key, *self._waiters]
            self._listening = frozenset(keys)
            reading = self._reads()
            try:
                pipe = self._blocking.pipeline(transaction=False)
                pipe.blpop(keys, timeout=self._listen_s)
                for _waiting, _call_id, record in reading:
                    pipe.hget(record, CallField.RESULT)
                # A failed read only costs its waiter a read of its own: the BLPOP's reply counts.
                popped, *raw = await pipe.execute(raise_on_error=False)
                if isinstance(popped, Exception):
                    raise popped
            except redis.RedisError as exc:
                self._fail_all(store_error_of(exc))
                return
            finally:
                self._listening = frozenset()
            if popped is not None and popped[0] != self._poke_key:
                await self._deliver(str(popped[0]), str(popped[1]), _read_by_waiter(reading, raw))

    def _reads(self) -> list[tuple[_Waiting, str, str]]:
        """The results to read behind the next BLPOP, or none past ``_MAX_READS``.

        Only waiters of several calls: a waiter of one gets its answer with its signal.
        """
        reading: list[tuple[_Waiting, str, str]] = []
        for waiters in self._waiters.values():
            for waiting in waiters:
                if not waiting.woken.done() and len(waiting.reads) > 1:
                    reading.extend((waiting, call_id, record) for call_id, record in waiting.reads.items())
                    if len(reading) > _MAX_READS:
                        return []  # with thousands waiting, stop counting early
        return reading

    async def _deliver(
        self, done_key: str, raw: str, read: Mapping[_Waiting, dict[str, str | None]] | None = None
    ) -> None:
        waiters = self._waiters.get(done_key, [])
        if not waiters:
            self._kept.setdefault(done_key, _Kept()).signals.append(raw)
            return
        signal = Signal.parse(raw)
        owners = [w for w in waiters if signal.call_id in w.mine or not w.mine]
        if owners or signal.handed_back:
            for waiting in owners or waiters:  # a marked signal of nobody here: let them all look
                _wake(waiting, _learned(waiting, signal, (read or {}).get(waiting)))
            return
        await self._hand_back(done_key, signal)

    async def _claim_kept(self, done_key: str, mine: frozenset[str]) -> bool:
        kept = self._kept.pop(done_key, None)
        if kept is None:
            return False
        for raw in kept.signals:
            signal = Signal.parse(raw)
            if mine and not signal.handed_back and signal.call_id not in mine:
                await self._hand_back(done_key, signal)
        return True

    async def _hand_back(self, done_key: str, signal: Signal) -> None:
        try:
            # The pop may have emptied (deleted) the list: a push that creates it sets its TTL.
            pipe = self._quick.pipeline(transaction=False)
            pipe.rpush(done_key, signal.marked())
            pipe.expire(done_key, self._done_expire_s)
            await pipe.execute()
        except redis.RedisError as exc:
            log.debug("could not hand back a signal on %s: %s", done_key, exc)  # its owner checks anyway

    def _anyone_unwoken(self) -> bool:
        """Whether a waiter still needs a signal.

        Woken waiters are still listed until they resume; listening again for them alone would
        put a ``BLPOP`` before their results are read, on every answer's path. A woken
        waiter that waits again starts a new listening task.
        """
        return any(not w.woken.done() for waiters in self._waiters.values() for w in waiters)

    def _forget_old_kept(self) -> None:
        now = time.monotonic()
        for key in [k for k, kept in self._kept.items() if now - kept.since > _KEEP_UNCLAIMED_S]:
            del self._kept[key]

    def _fail_all(self, failure: StoreError) -> None:
        """The connection failed: every waiter gets the error now; the next wait starts over."""
        for waiters in self._waiters.values():
            for waiting in waiters:
                if not waiting.woken.done():
                    waiting.woken.set_exception(failure)


def _read_by_waiter(
    reading: list[tuple[_Waiting, str, str]], raw: list[Any]
) -> dict[_Waiting, dict[str, str | None]]:
    """Each waiter's reads, for waiters all of whose reads succeeded."""
    by_waiter: dict[_Waiting, dict[str, str | None]] = {}
    failed: set[_Waiting] = set()
    for (waiting, call_id, _record), reply in zip(reading, raw, strict=True):
        if isinstance(reply, Exception):
            failed.add(waiting)
        else:
            by_waiter.setdefault(waiting, {})[call_id] = None if reply is None else str(reply)
    return {waiting: read for waiting, read in by_waiter.items() if waiting not in failed}


def _learned(
    waiting: _Waiting, signal: Signal, read: dict[str, str | None] | None
) -> dict[str, str | None] | None:
    """What a woken waiter knows without a read of its own.

    What was read behind the BLPOP and the result the signal carries; None when that does
    not cover every call it reads.
    """
    if signal.result is None or signal.call_id not in waiting.reads:
        return read
    if read is not None:
        return {**read, signal.call_id: signal.result}
    if len(waiting.reads) == 1:
        return {signal.call_id: signal.result}
    return None


def _wake(waiting: _Waiting, read: dict[str, str | None] | None) -> None:
    if not waiting.woken.done():
        waiting.woken.set_result(read)
