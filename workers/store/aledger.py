"""The ledger for asyncio callers: what waiting for answers needs, on ``redis.asyncio``.

The async twin of the waiting half of :class:`workers.store.ledger.Ledger`: the same keys
(:class:`RunKeys`), the same Lua scripts and the same replies, so a record written through
either is read the same through the other. A waiter blocked here holds a connection, not a
thread. Times come in as arguments; nothing here reads the clock.

A client belongs to the event loop it was first used on: open one per loop
(``workers.runtime.open_async_ledger``), and ``await aclose()`` it before that loop ends.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aredis
from redis.asyncio.client import Pipeline
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.exceptions import NoScriptError

from workers.core.failure_policy import FallbackRule, delivered
from workers.core.models import CallState, ToolResult
from workers.core.sentinel_url import SentinelAccess
from workers.core.waiting import ActionKind, OpenCall, Reap
from workers.errors import StoreError
from workers.store.call_views import OPEN_FIELDS, announce, event_entry, open_call, synthetic_event_fields
from workers.store.connection import sentinel_client_kwargs, sentinel_of
from workers.store.done_listener import DoneListener
from workers.store.done_signals import results_of
from workers.store.index_ttl import IndexTtl
from workers.store.keys import RunKeys, events_stream_key
from workers.store.keys import run_member as run_index_member
from workers.store.ledger_args import finish_call
from workers.store.lua import script_source
from workers.store.records import CALL, CallField
from workers.store.redis_errors import store_error_of
from workers.store.registration import RegisterStep, Registration
from workers.store.replica_acks import ReplicaAcks, Seal, no_seal
from workers.store.rows import Row

__all__ = ["AsyncLedger", "DoneListener", "aconnect", "astore_errors"]

log = logging.getLogger(__name__)


@asynccontextmanager
async def astore_errors() -> AsyncIterator[None]:
    """Turn redis-py connection and protocol errors into ``StoreError`` (refusals by cause)."""
    try:
        yield
    except redis.RedisError as exc:
        raise store_error_of(exc) from exc


class _BlockingSentinelPool(SentinelConnectionPool, aredis.BlockingConnectionPool):
    """Sentinel's pool (it follows the primary) that waits for a free connection, as below."""


def aconnect(
    url: str,
    *,
    socket_timeout_s: float,
    socket_connect_timeout_s: float,
    max_connections: int,
    sentinel: SentinelAccess | None = None,
) -> aredis.Redis:
    """An asyncio client for ``url`` with bounded timeouts (like :func:`~workers.store.connection.connect`).

    Its pool holds at most ``max_connections``; a command finding them all busy waits for one
    (up to the socket timeout) instead of connecting again: under load, connecting is what
    costs the event loop most.
    """
    if not url:
        raise StoreError("no Redis URL configured: set UNSTUCK_REDIS__URL or start `unstuck up`")
    followed = sentinel_of(url, sentinel)
    if followed is not None:
        to_sentinels, to_primary = sentinel_client_kwargs(
            followed, socket_timeout_s=socket_timeout_s, socket_connect_timeout_s=socket_connect_timeout_s
        )
        nodes = list(followed.url.nodes)
        sentinels = Sentinel(nodes, sentinel_kwargs=to_sentinels, **to_primary)  # type: ignore[no-untyped-call]
        client: aredis.Redis = sentinels.master_for(
            followed.master,
            connection_pool_class=_BlockingSentinelPool,
            max_connections=max_connections,
            timeout=socket_timeout_s,
            health_check_interval=5,
        )
        return client
    pool = aredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=socket_timeout_s,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=socket_connect_timeout_s,
        health_check_interval=5,
        decode_responses=True,
    )
    return aredis.Redis.from_pool(pool)


_PipeStep = Callable[[Pipeline], None]


@dataclass(frozen=True)
class _Script:
    text: str
    sha: str

    @classmethod
    def named(cls, name: str, *, with_summary: bool = False) -> _Script:
        text = script_source(name, with_summary=with_summary)
        return cls(text, hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest())


class AsyncLedger:
    """Async Redis access for waiting on call results. All methods raise ``StoreError``."""

    def __init__(
        self,
        client: aredis.Redis,
        *,
        prefix: str,
        ttl_s: int,
        listener: DoneListener,
        fallbacks: Mapping[str, FallbackRule] | None = None,
        lease_ttl_ms: int = 0,
        replica_acks: ReplicaAcks | None = None,
    ) -> None:
        self.client = client
        self.replica_acks = replica_acks or ReplicaAcks(0, 0, 0.0)  # redis.min_replica_acks
        self.lease_ttl_ms = lease_ttl_ms  # the hold of a registered call not yet marked dispatched
        # tools.fallbacks, applied where every result enters the ledger (as ``Ledger.finish``).
        self.fallbacks: Mapping[str, FallbackRule] = dict(fallbacks or {})
        self._listener = listener
        # As ``Ledger.on_answered``: called with every result this client stored first (best
        # effort, never failing a write); the gateway closes the call's task in Flower from here.
        self.on_answered: list[Callable[[RunKeys, ToolResult], None]] = []
        self.prefix = prefix
        self.ttl_s = ttl_s
        self._index_ttl = IndexTtl(ttl_s)
        self._register = _Script.named("ledger_register.lua", with_summary=True)
        self._finish = _Script.named("ledger_finish.lua", with_summary=True)
        self._requeue = _Script.named("ledger_requeue.lua", with_summary=True)
        self._republish = _Script.named("ledger_republish.lua")
        self._open = _Script.named("ledger_open.lua")
        self._touch = _Script.named("session_touch.lua")

    def keys(self, session_key: str, run_id: str) -> RunKeys:
        """The key builder for one run."""
        return RunKeys(self.prefix, session_key, run_id)

    async def aclose(self) -> None:
        """Close the client's connections and the listener's (on the loop they belong to)."""
        await self._listener.aclose()
        await self.client.aclose()

    async def _script(
        self,
        script: _Script,
        keys: list[str],
        args: list[Any],
        then: _PipeStep | None = None,
        *,
        decides: bool = False,
    ) -> Any:
        """Run ``script`` (and ``then``'s commands) in one round trip; returns the script's reply.

        As in the sync ledger: ``EVALSHA`` straight away, and after a Redis restart that lost
        its scripts, load and retry once. A script that ``decides`` (a registration, a result)
        answers only once ``redis.min_replica_acks`` replicas hold it (``workers.store.replica_acks``).
        """
        if decides:
            send = functools.partial(self._send, script, keys, args, then)
            return (await self.replica_acks.aconfirmed(self.client, send))[0]
        return (await self._send(script, keys, args, then, no_seal))[0]

    async def _send(
        self, script: _Script, keys: list[str], args: list[Any], then: _PipeStep | None, seal: Seal
    ) -> list[Any]:
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            if then is not None:
                then(pipe)
            seal(pipe)
            try:
                return await pipe.execute()
            except NoScriptError:
                if attempt == 2:
                    raise
                await self.client.script_load(script.text)
            except BaseException:
                self._index_ttl.forget()  # the EXPIREs it carried may not have run
                raise
        return []

    async def results(self, keys: RunKeys, call_ids: Sequence[str]) -> dict[str, ToolResult]:
        """The delivered results among ``call_ids``."""
        if not call_ids:
            return {}

        async def read(seal: Seal) -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for call_id in call_ids:
                pipe.hget(keys.call(call_id), CallField.RESULT)
            seal(pipe)  # confirmed: what is handed on is on the replicas
            return await pipe.execute()

        async with astore_errors():
            raw = await self.replica_acks.aconfirmed(self.client, read, read=True)
        return {cid: ToolResult.from_json(r) for cid, r in zip(call_ids, raw, strict=True) if r}

    async def wait_for_done(self, keys: RunKeys, timeout_s: float, *, mine: Collection[str] = ()) -> bool:
        """Wait up to ``timeout_s`` for the next "a call of this run was answered" signal.

        The protocol of :meth:`Ledger.wait_for_done`, on the loop's one listening connection
        (:class:`DoneListener`) instead of a connection per waiter.
        """
        return await self._listener.wait(keys.done, timeout_s, mine=mine)

    async def wait_for_results(
        self, keys: RunKeys, timeout_s: float, *, mine: Collection[str] = (), read: Sequence[str] = ()
    ) -> dict[str, ToolResult] | None:
        """:meth:`wait_for_done`, then the delivered results among ``read`` (``Ledger.wait_for_results``).

        None when no signal came within ``timeout_s``. One call's answer usually comes with its
        signal, and the listener reads several behind its ``BLPOP`` while few calls are waited
        on; otherwise they take one more round trip.
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
        return learned

    async def register_call(
        self,
        keys: RunKeys,
        call_id: str,
        *,
        now_ms: int,
        deadline_ms: int,
        fields: dict[str, str],
        push: tuple[str, str] | None = None,
    ) -> Registration:
        """Record a new call and read its run's status and guard state (``Ledger.register_call``)."""
        step = RegisterStep(
            keys, call_id, now_ms=now_ms, deadline_ms=deadline_ms, fields=fields, ttl_s=self.ttl_s, push=push
        )

        def index(pipe: Pipeline) -> None:
            step.index(pipe, self._index_ttl, self.lease_ttl_ms)

        async with astore_errors():
            return step.registration(
                await self._script(self._register, *step.script_call, index, decides=True)
            )

    async def finish(self, keys: RunKeys, result: ToolResult, *, now_ms: int, writer: str) -> bool:
        """Store ``result`` (or its configured fallback) if it is the first, else keep it as late.

        True when it won; the twin of ``Ledger.finish``.
        """
        result = delivered(result, self.fallbacks)
        call_id = result.tool_call_id
        member = keys.due_member(call_id)

        def unindex(pipe: Pipeline) -> None:
            pipe.zrem(keys.index.due, member)
            if self._index_ttl.due(keys.index.due):  # as Ledger._refresh_index_ttl
                pipe.expire(keys.index.due, self._index_ttl.expire_s)
            pipe.zrem(keys.index.leases, member)

        script_keys, args = finish_call(keys, result, now_ms=now_ms, ttl_s=self.ttl_s, writer=writer)
        async with astore_errors():
            won = await self._script(self._finish, script_keys, args, unindex, decides=True)
        if won and result.synthetic:
            await self.publish_event("synthetic", **synthetic_event_fields(keys, result, writer))
        if won:
            announce(self.on_answered, keys, result)
        return bool(won)

    async def publish_event(self, kind: str, **fields: Any) -> None:
        """Append an event to the capped events stream; best effort, as in the sync ledger."""
        entry = event_entry(kind, fields)
        key = events_stream_key(self.prefix)
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.xadd(key, entry, maxlen=10_000, approximate=True)  # type: ignore[arg-type]
            pipe.expire(key, self.ttl_s)
            await pipe.execute()
        except redis.RedisError:
            pass  # an event is a convenience for operators, never a reason to fail a call

    async def requeue(self, keys: RunKeys, call_id: str, *, expected_attempt: int, now_ms: int) -> bool:
        """Make a lost idempotent call pending again; True when this caller should re-dispatch."""
        async with astore_errors():
            script_keys = [keys.call(call_id), keys.lease(call_id), keys.run]
            return bool(await self._script(self._requeue, script_keys, [expected_attempt, now_ms]))

    async def count_republish(self, keys: RunKeys, call_id: str, *, expected: int, now_ms: int) -> bool:
        """:meth:`workers.store.ledger.Ledger.count_republish`, awaited."""
        async with astore_errors():
            script_keys = [keys.call(call_id), keys.lease(call_id)]
            return bool(await self._script(self._republish, script_keys, [expected, now_ms]))

    async def reap(self, keys: RunKeys, reaps: Sequence[Reap], *, now_ms: int, writer: str) -> list[str]:
        """``Ledger.reap``, awaited: the ids of calls taken back for another worker."""
        resend = []
        for reap in reaps:
            call = reap.call
            if reap.answer is not None:
                await self.finish(keys, reap.answer, now_ms=now_ms, writer=writer)
            elif reap.kind is ActionKind.REQUEUE:
                if await self.requeue(keys, call.call_id, expected_attempt=call.attempt, now_ms=now_ms):
                    resend.append(call.call_id)
            elif await self.count_republish(keys, call.call_id, expected=call.republishes, now_ms=now_ms):
                resend.append(call.call_id)
        return resend

    async def open_calls(self, keys: RunKeys, call_ids: Sequence[str]) -> list[OpenCall]:
        """Snapshot of the given calls that have no result yet (one round trip)."""
        if not call_ids:
            return []
        script_keys = [k for cid in call_ids for k in (keys.call(cid), keys.lease(cid))]
        async with astore_errors():
            replies = await self._script(self._open, script_keys, list(OPEN_FIELDS))
        calls = []
        for call_id, (lease_alive, reply) in zip(call_ids, replies, strict=True):
            row = Row.zip(CALL, OPEN_FIELDS, reply, where=keys.call(call_id))
            if CallField.CALL_ID in row:  # registered (not expired, not a stray write)
                calls.append(open_call(row, bool(lease_alive)))
        return [call for call in calls if call.state is not CallState.DONE]

    async def run_call_ids(self, keys: RunKeys) -> list[str]:
        """Every call id of a run in submission order."""
        async with astore_errors():
            return [str(member) for member in await self.client.zrange(keys.calls, 0, -1)]

    async def touch_progress(self, keys: RunKeys, now_ms: int) -> bool:
        """Record progress of a run (as ``SessionStore.touch_progress``); False once it stopped running."""
        by_progress = keys.index.by_progress
        member = run_index_member(keys.session_key, keys.run_id)

        def index(pipe: Pipeline) -> None:
            # In the same round trip even if the run stopped: XX GT never adds a member nor
            # moves one back, so an ended run's index entry is left as it was or moved forward.
            pipe.zadd(by_progress, {member: now_ms}, xx=True, gt=True)

        async with astore_errors():
            return bool(await self._script(self._touch, [keys.run], [now_ms], index))
