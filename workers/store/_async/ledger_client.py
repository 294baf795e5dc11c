"""The ledger's client: one record per tool call, first-writer-wins results, leases, heartbeats.

Written once, for asyncio: the sync client (:class:`workers.store.ledger.Ledger`'s base) is
generated from this module (``make generate``), so both send the same commands in the same
round trips. Each change is an :class:`~workers.store.ledger_ops.Op` of the one script table;
a client only sends it. Waiting for results is not here: each side waits its own way
(:mod:`workers.store.ledger`).
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar, cast

import redis.asyncio as redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from workers.core.models import ToolResult
from workers.core.reaping import OpenCall, Reap, next_look_ms, past_first_look
from workers.errors import StoreError
from workers.store._async.replica_sends import confirmed
from workers.store.claims import Claim, claim_of
from workers.store.connection import store_errors
from workers.store.done_signals import KEYS_REFRESH_S, stored_results
from workers.store.kept_answers import KeptAnswers
from workers.store.keys import IndexTtl, RunKeys, index_keys
from workers.store.ledger_ops import (
    RUNNING_FIELDS,
    SCRIPT_TABLE,
    Cmd,
    Op,
    Registration,
    events_commands,
    nonce,
    open_calls_of,
    open_op,
    resend_op,
    synthetic_event_fields,
    touch_op,
)
from workers.store.pipelines import apipeline
from workers.store.records import CALL, CallField, CallRecord, Row, pgid_field, pgid_of
from workers.store.replica_acks import ReplicaAcks, Seal, no_seal
from workers.store.run_indexes import RunKeysTtl

__all__ = ["AsyncLedgerClient", "run_plan"]

log = logging.getLogger(__name__)

T = TypeVar("T")
#: A plan's steps (:class:`workers.answering.service.Plan`): each names a ledger method and its arguments.
Steps = Generator[tuple[str, tuple[Any, ...], dict[str, Any]], Any, T]


async def run_plan(steps: Steps[T], ledger: AsyncLedgerClient) -> T:
    """Run a plan on ``ledger``: each step's method called (awaited where it is async), its reply sent back.

    A ``StoreError`` is thrown into the plan, which handles it or lets it out.
    """
    reply: Any = None
    failure: StoreError | None = None
    try:
        while True:
            method, args, kwargs = steps.send(reply) if failure is None else steps.throw(failure)
            try:
                reply, failure = getattr(ledger, method)(*args, **kwargs), None
                if inspect.isawaitable(reply):  # some methods are sync (handed); none on the sync side
                    reply = await reply
            except StoreError as exc:
                failure = exc
    except StopIteration as done:
        return cast(T, done.value)


class AsyncLedgerClient:
    """The ledger on one Redis client (a cluster client too). All methods raise ``StoreError``.

    Registrations may have a client of their own (``registering``, default: ``client``): see
    :class:`workers.store.ledger.AsyncLedger`.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str,
        ttl_s: int,
        lease_ttl_ms: int,
        replica_acks: ReplicaAcks | None = None,
        registering: redis.Redis | None = None,
    ) -> None:
        self.client = client
        self.registering = registering or client
        self.replica_acks = replica_acks or ReplicaAcks(0, 0, 0.0)  # redis.min_replica_acks
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.lease_ttl_ms = lease_ttl_ms
        # Called with every result this client stored first (best effort, never failing a
        # write): the gateway and the watchdog close the call's task in Flower from here.
        self.on_answered: list[Callable[[RunKeys, ToolResult], None]] = []
        self._index_ttl = IndexTtl(ttl_s)
        self._keys_ttl = RunKeysTtl(ttl_s)
        # Through the Sentinels: where answers read with no replica's acknowledgement are kept
        # until one holds them (workers.store.kept_answers); None elsewhere.
        self.kept: KeptAnswers | None = None

    async def aclose(self) -> None:
        """Release the clients' connections (a later call reconnects)."""
        if self.registering is not self.client:
            await self.registering.aclose()
        await self.client.aclose()

    def keys(self, session_key: str, run_id: str) -> RunKeys:
        """The key builder for one run."""
        return RunKeys(self.prefix, session_key, run_id)

    def handed(self, keys: RunKeys, answers: dict[str, ToolResult]) -> dict[str, ToolResult]:
        """``answers``, handed on now: kept first when the primary had no replica in sync (reads do it)."""
        if self.kept is not None and answers and self.replica_acks.unacknowledged:
            pool = getattr(self.client, "connection_pool", None)  # a cluster client has none
            address = getattr(pool, "master_address", None)
            self.kept.keep(keys, answers, (str(address[0]), int(address[1])) if address else None)
        return answers

    # -- sending -------------------------------------------------------------------------------

    async def _run(self, op: Op, client: redis.Redis | None = None) -> Any:
        """Send ``op`` (on ``client``, default the ledger's); its script's reply."""
        on = client or self.client
        with store_errors():
            if op.decides:
                replies = await confirmed(
                    self.replica_acks, on, lambda seal: self._send(op, seal, on), slot_key=op.keys[0]
                )
                return replies[0]
            return (await self._send(op, no_seal, on))[0]

    async def _send(self, op: Op, seal: Seal, client: redis.Redis) -> list[Any]:
        for attempt in (1, 2):
            pipe = apipeline(client)
            op.pipeline(pipe, self._route(client, op.keys[0]))
            seal(pipe)
            try:
                return await pipe.execute()
            except NoScriptError:  # a Redis restart lost the scripts: load, then once more
                if attempt == 2:
                    raise
                await client.script_load(SCRIPT_TABLE[op.script].text)
            except BaseException:
                self._index_ttl.forget()  # the EXPIREs it carried may not have run
                raise
        return []

    @staticmethod
    def _route(client: redis.Redis, key: str) -> dict[str, Any]:
        """Where a pipelined script goes: its keys' node, given, on a cluster client.

        Left to itself, redis-py's cluster pipeline asks a node (``COMMAND GETKEYS``, one more
        round trip) where each EVALSHA goes; every key of a script shares one slot.
        """
        if isinstance(client, RedisCluster):
            return {"target_nodes": client.get_node_from_key(key)}
        return {}

    def _index_expire(self, key: str) -> tuple[Cmd, ...]:
        # An index expires like everything else, after its last write (see IndexTtl).
        return (("expire", (key, self._index_ttl.expire_s), {}),) if self._index_ttl.due(key) else ()

    # -- registering and claiming ---------------------------------------------------------------

    async def register(
        self, keys: RunKeys, call_id: str, *, now_ms: int, deadline_ms: int, fields: dict[str, str]
    ) -> bool:
        """Record a new call; False when the id was already registered (do not dispatch again)."""
        registration = await self.register_call(
            keys, call_id, now_ms=now_ms, deadline_ms=deadline_ms, fields=fields
        )
        return registration.created

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
        """Record a new call and read its run's status and guard state, in one round trip.

        ``push`` (a broker queue's list key and a task message) is pushed in the same script
        when the call is new and its run accepts it: registered and published in one step.
        A nonce of its own goes last (field ``reg``): the same arguments sent again are the same
        registration. The indexes are hints the watchdog re-checks, so they are written even when
        the id existed or the run refused it. The call is due for the sweep's first look at its
        deadline, or one lease after submission when sooner: a call answered by then (most) is
        never looked at; a running one is put in the lease index then, a queued one is due again
        at its deadline, and one never dispatched (its gateway died before publishing) is found
        without waiting for its deadline.

        Raises:
            ValueError: when ``fields`` names a field the call record does not declare.
            StoreError: when Redis fails.
        """
        undeclared = sorted(set(fields) - set(CALL.fields))
        if undeclared:
            raise ValueError(f"not fields of the call record: {undeclared}")
        flat = [item for pair in {**fields, CallField.CALL_ID: call_id}.items() for item in pair]
        script_keys, message = [keys.call(call_id), keys.calls, keys.run], ""
        if push is not None:
            script_keys.append(push[0])
            message = push[1]
        last = [CallField.REG.value, nonce()]
        until_ms = self._keys_ttl.until_ms(deadline_ms)
        args = [call_id, now_ms, deadline_ms, self.ttl_s, KEYS_REFRESH_S, until_ms, message, *flat, *last]
        score = next_look_ms(deadline_ms, now_ms, self.lease_ttl_ms)
        due = keys.index.due
        then = (("zadd", (due, {keys.due_member(call_id): score}), {"nx": True}), *self._index_expire(due))
        op = Op("ledger_register.lua", script_keys, args, then, decides=True)
        return Registration.of(await self._run(op, self.registering))

    async def mark_dispatched(self, keys: RunKeys, call_id: str, task_id: str) -> None:
        """Note that the broker accepted the call's message."""
        # The due index keeps the registration's score (the sweep's first look, at most one
        # lease after submission): a worker may already have claimed the call by now.
        with store_errors():
            await self.client.hset(
                keys.call(call_id), mapping={CallField.DISPATCHED: "1", CallField.TASK_ID: task_id}
            )

    async def claim(
        self,
        keys: RunKeys,
        call_id: str,
        *,
        worker_id: str,
        now_ms: int,
        tool: str,
        job_digest: str,
        submitted_ms: int | None = None,
        deadline_ms: int | None = None,
    ) -> Claim:
        """Claim a registered call for running; a finished call is never claimed again.

        ``tool``, ``job_digest``, ``submitted_ms`` and ``deadline_ms`` are those of the message
        received: a call that was never registered, or registered with another tool or digest,
        is refused (never claimed); the registered job past its deadline is ``expired`` (never
        claimed, its gateway or the watchdog answers it; the digest binds the deadline to the
        registration). A nonce of its own makes the same claim sent again the same claim. A
        claim within half a lease of submission writes no lease-index entry
        (:func:`~workers.core.waiting.past_first_look`): one command less per call; a later one
        puts the call in the lease index (a hint the sweep re-checks, even for a claim that
        found the call done or busy).
        """
        script_keys = [keys.call(call_id), keys.lease(call_id), keys.run]
        deadline = "" if deadline_ms is None else deadline_ms
        args = [now_ms, worker_id, self.lease_ttl_ms, tool, job_digest, nonce(), deadline]
        then: tuple[Cmd, ...] = ()
        if past_first_look(now_ms=now_ms, submitted_ms=submitted_ms, lease_ms=self.lease_ttl_ms):
            leases = keys.index.leases
            lease_end = {keys.due_member(call_id): now_ms + self.lease_ttl_ms}
            then = (("zadd", (leases, lease_end), {}), *self._index_expire(leases))
        return claim_of(await self._run(Op("ledger_claim.lua", script_keys, args, then, decides=True)))

    # -- answering ------------------------------------------------------------------------------

    async def finish(
        self, keys: RunKeys, result: ToolResult, *, now_ms: int, writer: str, submitted_ms: int | None = None
    ) -> bool:
        """Store ``result`` as it is if it is the first, else keep it as late; True when it won.

        ``result`` is what the agent is given: writers compose it with
        :func:`~workers.core.failure_policy.delivered` (``tools.fallbacks``) before they call this.
        ``submitted_ms``, when the writer knows it, spares the lease-index removal of a call
        answered within half a lease of submission, which was never put there.
        """
        call_id = result.tool_call_id
        script_keys = [keys.call(call_id), keys.late(call_id), keys.done, keys.run, keys.calls]
        args = [call_id, result.to_json(), result.reason or "", now_ms, self.ttl_s, writer, KEYS_REFRESH_S]
        member = keys.due_member(call_id)
        then: tuple[Cmd, ...] = (("zrem", (keys.index.due, member), {}), *self._index_expire(keys.index.due))
        if past_first_look(now_ms=now_ms, submitted_ms=submitted_ms, lease_ms=self.lease_ttl_ms):
            then += (("zrem", (keys.index.leases, member), {}),)
        won = bool(await self._run(Op("ledger_finish.lua", script_keys, args, then, decides=True)))
        if won and result.synthetic:
            await self.publish_event("synthetic", **synthetic_event_fields(keys, result, writer))
        if won:
            self._stored_first(keys, result)
        return won

    def _stored_first(self, keys: RunKeys, result: ToolResult) -> None:
        """Tell the ``on_answered`` listeners; a listener never fails the write."""
        for listener in self.on_answered:
            try:
                listener(keys, result)
            except Exception as exc:  # noqa: BLE001 - a listener never makes a stored answer fail
                log.warning("answer listener failed for call %s: %s", result.tool_call_id, exc)

    async def publish_event(self, kind: str, **fields: Any) -> None:
        """Append an event to the capped events stream (read by ``unstuck up``); best effort."""
        try:
            pipe = apipeline(self.client)
            for method, args, kwargs in events_commands(self.prefix, self.ttl_s, kind, fields):
                getattr(pipe, method)(*args, **kwargs)
            await pipe.execute()
        except redis.RedisError:
            pass  # an event is a convenience for operators, never a reason to fail a call

    async def reap(
        self, keys: RunKeys, reaps: Sequence[Reap], *, now_ms: int, writer: str
    ) -> tuple[int, list[str]]:
        """Apply the reaper's decisions on calls of one run (:func:`workers.core.waiting.reaps`).

        Returns how many calls were answered here and the ids of those taken back for another
        worker, whose task the caller sends again.
        """
        answered, resend = 0, []
        for reap in reaps:
            if reap.answer is not None:
                answered += await self.finish(keys, reap.answer, now_ms=now_ms, writer=writer)
            elif await self._run(resend_op(keys, reap, now_ms)):
                resend.append(reap.call.call_id)
        return answered, resend

    # -- progress and leases --------------------------------------------------------------------

    async def heartbeat(self, keys: RunKeys, call_id: str, *, now_ms: int, details: Any) -> None:
        """Record a tool's progress report (and so the run's progress)."""
        progress = json.dumps(details, default=str)[:2000]
        await self._run(Op("ledger_heartbeat.lua", [keys.call(call_id), keys.run], [now_ms, progress]))

    async def touch_progress(self, keys: RunKeys, now_ms: int) -> bool:
        """Record progress of a run, in one round trip; False once it stopped running (superseded, ended)."""
        return bool(await self._run(touch_op(keys, now_ms)))

    async def add_process_group(self, keys: RunKeys, call_id: str, pgid: int) -> None:
        """Remember a process group the tool started (killed by the main process on a hard end)."""
        with store_errors():
            await self.client.hset(keys.call(call_id), pgid_field(pgid), "1")

    async def process_groups(self, keys: RunKeys, call_id: str) -> list[int]:
        """Process groups recorded for a call."""
        with store_errors():
            fields = [str(f) for f in await self.client.hkeys(keys.call(call_id))]
        return [pgid for f in fields if (pgid := pgid_of(f)) is not None]

    async def renew_leases(
        self, calls: Sequence[tuple[RunKeys, str]], worker_id: str, *, now_ms: int
    ) -> None:
        """Extend live leases and their scores in the lease index, in one round trip.

        ``XX`` on both: a finished call's lease, or its index member, is never brought back.
        A call not in the lease index yet (claimed soon after submission) is put there by the
        sweep's first look, by its lease's end as this renewal left it.
        """
        if not calls:
            return
        until = now_ms + self.lease_ttl_ms
        with store_errors():
            pipe = apipeline(self.client)
            for keys, call_id in calls:
                pipe.set(keys.lease(call_id), worker_id, px=self.lease_ttl_ms, xx=True)
            buckets: dict[int, dict[str, int]] = {}
            for keys, call_id in calls:
                buckets.setdefault(keys.bucket, {})[keys.due_member(call_id)] = until
            for bucket, members in buckets.items():
                pipe.zadd(index_keys(self.prefix, bucket).leases, members, xx=True, gt=True)
            await pipe.execute()

    # -- reading --------------------------------------------------------------------------------

    async def running_states(self, calls: Sequence[tuple[RunKeys, str]]) -> list[tuple[str, str, int]]:
        """(state, worker, last heartbeat ms) of each call, in one round trip; '' when unknown."""
        if not calls:
            return []
        with store_errors():
            pipe = apipeline(self.client)
            for keys, call_id in calls:
                pipe.hmget(keys.call(call_id), RUNNING_FIELDS)
            replies = await pipe.execute()
        rows = [Row.zip(CALL, RUNNING_FIELDS, reply) for reply in replies]
        return [
            (row.raw(CallField.STATE) or "", row.text(CallField.WORKER), row.integer(CallField.HB_MS))
            for row in rows
        ]

    async def results(self, keys: RunKeys, call_ids: Sequence[str]) -> dict[str, ToolResult]:
        """The delivered results among ``call_ids``, confirmed on the replicas when they are fenced."""
        if not call_ids:
            return {}

        async def read(seal: Seal) -> list[Any]:
            pipe = apipeline(self.client)
            for call_id in call_ids:
                pipe.hget(keys.call(call_id), CallField.RESULT)
            seal(pipe)  # confirmed: what is handed on is on the replicas
            return await pipe.execute()

        with store_errors():
            raw = await confirmed(
                self.replica_acks, self.client, read, read=True, slot_key=keys.call(call_ids[0])
            )
            return self.handed(keys, stored_results(call_ids, raw))

    async def open_calls(self, keys: RunKeys, call_ids: Sequence[str]) -> list[OpenCall]:
        """Snapshot of the given calls that have no result yet (one round trip)."""
        if not call_ids:
            return []
        return open_calls_of(keys, call_ids, await self._run(open_op(keys, call_ids)))

    async def run_call_ids(self, keys: RunKeys) -> list[str]:
        """Every call id of a run in submission order."""
        with store_errors():
            return [str(member) for member in await self.client.zrange(keys.calls, 0, -1)]

    async def record(self, keys: RunKeys, call_id: str) -> CallRecord | None:
        """The full record of one call, or None."""
        with store_errors():
            raw = await self.client.hgetall(keys.call(call_id))
        return CallRecord.of(keys, call_id, {str(k): str(v) for k, v in raw.items()})

    async def late_results(self, keys: RunKeys, call_id: str) -> list[ToolResult]:
        """Results that lost the race for a call (audit)."""
        with store_errors():
            raw = await self.client.lrange(keys.late(call_id), 0, -1)
        return [ToolResult.from_json(r) for r in raw]
