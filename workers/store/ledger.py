"""The result ledger: one record per tool call, first-writer-wins results, leases, heartbeats.

Every multi-step change is one Lua script over the keys of a single run (see
:mod:`workers.store.keys`). Times come in as arguments; nothing here reads the clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import redis
from redis.client import Pipeline
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from workers.core.failure_policy import FallbackRule, delivered
from workers.core.models import CallState, ToolResult
from workers.core.waiting import ActionKind, OpenCall, Reap, past_first_look
from workers.store.answer_wait import wait_for_results
from workers.store.call_views import (
    OPEN_FIELDS,
    CallRecord,
    announce,
    event_entry,
    open_call,
    synthetic_event_fields,
)
from workers.store.claims import Claim, claim_of
from workers.store.connection import store_errors
from workers.store.index_ttl import IndexTtl
from workers.store.keys import RunKeys, events_stream_key, index_keys
from workers.store.ledger_args import claim_call, finish_call
from workers.store.lua import load_script
from workers.store.records import CALL, CallField, pgid_field, pgid_of
from workers.store.registration import RegisterStep, Registration
from workers.store.replica_acks import ReplicaAcks, Seal
from workers.store.rows import Row

__all__ = ["Claim", "Ledger", "Registration"]


_RUNNING_FIELDS = (CallField.STATE, CallField.WORKER, CallField.HB_MS)


class Ledger:
    """Redis access for call records. All methods raise ``StoreError`` when Redis fails."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str,
        ttl_s: int,
        lease_ttl_ms: int,
        fallbacks: Mapping[str, FallbackRule] | None = None,
        replica_acks: ReplicaAcks | None = None,
    ) -> None:
        self.client = client
        self.replica_acks = replica_acks or ReplicaAcks(0, 0, 0.0)  # redis.min_replica_acks
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.lease_ttl_ms = lease_ttl_ms
        # Called with every result this client stored first (best effort, never failing a
        # write): the gateway and the watchdog close the call's task in Flower from here.
        self.on_answered: list[Callable[[RunKeys, ToolResult], None]] = []
        # tools.fallbacks: every process builds its ledger from the same Settings, so every
        # writer (worker, gateway, watchdog, doors) stores the same bytes for the same failure.
        self.fallbacks: Mapping[str, FallbackRule] = dict(fallbacks or {})
        self._index_ttl = IndexTtl(ttl_s)
        self._register = load_script(client, "ledger_register.lua", with_summary=True)
        self._claim = load_script(client, "ledger_claim.lua", with_summary=True)
        self._finish = load_script(client, "ledger_finish.lua", with_summary=True)
        self._heartbeat = load_script(client, "ledger_heartbeat.lua", with_summary=True)
        self._requeue = load_script(client, "ledger_requeue.lua", with_summary=True)
        self._republish = load_script(client, "ledger_republish.lua")
        self._open = load_script(client, "ledger_open.lua")

    def _pipelined(
        self, script: Script, keys: list[str], args: list[Any], then: Callable[[Pipeline], None] | None
    ) -> Any:
        """Run ``script`` and the commands ``then`` adds in a single round trip; returns the script's reply.

        Only once ``redis.min_replica_acks`` replicas hold it (:mod:`workers.store.replica_acks`).
        ``EVALSHA`` goes straight into the pipeline (redis-py would first ask ``SCRIPT EXISTS``,
        an extra round trip); after a Redis restart that lost its scripts, load and retry once.
        """
        return self.replica_acks.confirmed(
            self.client, lambda seal: self._send(script, keys, args, then, seal), slot_key=keys[0]
        )[0]

    def _send(
        self,
        script: Script,
        keys: list[str],
        args: list[Any],
        then: Callable[[Pipeline], None] | None,
        seal: Seal,
    ) -> list[Any]:
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            # By name, not pipe.evalsha: redis-py's cluster pipeline blocks that method.
            evalsha = ("EVALSHA", script.sha, len(keys), *keys, *args)
            pipe.execute_command(*evalsha, **self._route(keys[0]))  # type: ignore[no-untyped-call]
            if then is not None:
                then(pipe)
            seal(pipe)
            try:
                return pipe.execute()
            except NoScriptError:
                if attempt == 2:
                    raise
                self.client.script_load(script.script)
            except BaseException:
                self._index_ttl.forget()  # the EXPIREs it carried may not have run
                raise
        return []

    def _route(self, key: str) -> dict[str, Any]:
        """Where a pipelined script goes: its keys' node, given, on a cluster client.

        Left to itself, redis-py's cluster pipeline asks a node (``COMMAND GETKEYS``, one more
        round trip) where each EVALSHA goes; every key of a script shares one slot.
        """
        if isinstance(self.client, RedisCluster):
            return {"target_nodes": self.client.get_node_from_key(key)}
        return {}

    def _refresh_index_ttl(self, pipe: Pipeline, key: str) -> None:
        # The index expires like everything else, after its last write (see IndexTtl).
        if self._index_ttl.due(key):
            pipe.expire(key, self._index_ttl.expire_s)

    def _unindex_call(self, pipe: Pipeline, keys: RunKeys, call_id: str, *, lease_indexed: bool) -> None:
        member = keys.due_member(call_id)
        pipe.zrem(keys.index.due, member)
        self._refresh_index_ttl(pipe, keys.index.due)
        if lease_indexed:
            pipe.zrem(keys.index.leases, member)

    def _index_lease(self, pipe: Pipeline, keys: RunKeys, call_id: str, until_ms: int) -> None:
        member = keys.due_member(call_id)
        # Added even when the claim found the call done or busy: the index is a hint the
        # sweep re-checks against the call record and its lease key.
        pipe.zadd(keys.index.leases, {member: until_ms})
        self._refresh_index_ttl(pipe, keys.index.leases)

    def keys(self, session_key: str, run_id: str) -> RunKeys:
        """The key builder for one run."""
        return RunKeys(self.prefix, session_key, run_id)

    def close(self) -> None:
        """Release the client's connections (a later call reconnects)."""
        self.client.close()

    def register(
        self, keys: RunKeys, call_id: str, *, now_ms: int, deadline_ms: int, fields: dict[str, str]
    ) -> bool:
        """Record a new call; False when the id was already registered (do not dispatch again)."""
        return self.register_call(
            keys, call_id, now_ms=now_ms, deadline_ms=deadline_ms, fields=fields
        ).created

    def register_call(
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

        Raises:
            ValueError: when ``fields`` names a field the call record does not declare.
            StoreError: when Redis fails.
        """
        step = RegisterStep(
            keys, call_id, now_ms=now_ms, deadline_ms=deadline_ms, fields=fields, ttl_s=self.ttl_s, push=push
        )

        def index(pipe: Pipeline) -> None:
            step.index(pipe, self._index_ttl, self.lease_ttl_ms)

        with store_errors():
            reply = self._pipelined(self._register, *step.script_call, index)
        return step.registration(reply)

    def mark_dispatched(self, keys: RunKeys, call_id: str, task_id: str) -> None:
        """Note that the broker accepted the call's message."""
        # The due index keeps the registration's score (the sweep's first look, at most one
        # lease after submission): a worker may already have claimed the call by now.
        with store_errors():
            self.client.hset(
                keys.call(call_id), mapping={CallField.DISPATCHED: "1", CallField.TASK_ID: task_id}
            )

    def claim(
        self,
        keys: RunKeys,
        call_id: str,
        *,
        worker_id: str,
        now_ms: int,
        tool: str,
        job_digest: str,
        submitted_ms: int | None = None,
    ) -> Claim:
        """Claim a registered call for running; a finished call is never claimed again.

        ``tool``, ``job_digest`` and ``submitted_ms`` are those of the message received: a
        call that was never registered, or registered with another tool or digest, is refused
        (never claimed). A claim within half a lease of submission writes no lease-index entry
        (:func:`~workers.core.waiting.past_first_look`): one command less per call.
        """
        script_keys, args = claim_call(
            keys, call_id, now_ms=now_ms, worker_id=worker_id, lease_ttl_ms=self.lease_ttl_ms,
            tool=tool, job_digest=job_digest,
        )  # fmt: skip
        index = None
        if past_first_look(now_ms=now_ms, submitted_ms=submitted_ms, lease_ms=self.lease_ttl_ms):
            lease_end_ms = now_ms + self.lease_ttl_ms

            def index(pipe: Pipeline) -> None:
                self._index_lease(pipe, keys, call_id, lease_end_ms)

        with store_errors():
            return claim_of(self._pipelined(self._claim, script_keys, args, index))

    def with_fallback(self, result: ToolResult) -> ToolResult:
        """What :meth:`finish` stores for ``result``: :func:`~workers.core.failure_policy.delivered`."""
        return delivered(result, self.fallbacks)

    def finish(
        self, keys: RunKeys, result: ToolResult, *, now_ms: int, writer: str, submitted_ms: int | None = None
    ) -> bool:
        """Store ``result`` (or its configured fallback) if it is the first, else keep it as late.

        True when it won. What is stored is :func:`~workers.core.failure_policy.delivered` of
        ``result``, the one function that applies ``tools.fallbacks`` (idempotent: a writer that
        computed it already, as the gateway does, stores the same bytes). ``submitted_ms``, when the
        writer knows it (the worker, from its message), spares the lease-index removal of a
        call answered within half a lease of submission, which was never put there.
        """
        result = self.with_fallback(result)
        call_id = result.tool_call_id
        lease_indexed = past_first_look(now_ms=now_ms, submitted_ms=submitted_ms, lease_ms=self.lease_ttl_ms)
        script_keys, args = finish_call(keys, result, now_ms=now_ms, ttl_s=self.ttl_s, writer=writer)
        with store_errors():
            won = self._pipelined(
                self._finish,
                script_keys,
                args,
                lambda pipe: self._unindex_call(pipe, keys, call_id, lease_indexed=lease_indexed),
            )
        if won and result.synthetic:
            self.publish_event("synthetic", **synthetic_event_fields(keys, result, writer))
        if won:
            announce(self.on_answered, keys, result)
        return bool(won)

    def publish_event(self, kind: str, **fields: Any) -> None:
        """Append an event to the capped events stream (read by ``unstuck up``); best effort."""
        entry = event_entry(kind, fields)
        key = events_stream_key(self.prefix)
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.xadd(key, entry, maxlen=10_000, approximate=True)  # type: ignore[arg-type]
            pipe.expire(key, self.ttl_s)
            pipe.execute()
        except redis.RedisError:
            pass  # an event is a convenience for operators, never a reason to fail a call

    def requeue(self, keys: RunKeys, call_id: str, *, expected_attempt: int, now_ms: int) -> bool:
        """Make a lost idempotent call pending again; True when this caller should re-dispatch."""
        with store_errors():
            script_keys = [keys.call(call_id), keys.lease(call_id), keys.run]
            return bool(self._requeue(keys=script_keys, args=[expected_attempt, now_ms]))

    def count_republish(self, keys: RunKeys, call_id: str, *, expected: int, now_ms: int) -> bool:
        """Count one more publish of a pending, unclaimed call's message (``ledger_republish.lua``).

        True when this caller should publish it: the call is still pending with no lease, and
        nobody counted a republish since ``expected`` was read.
        """
        with store_errors():
            script_keys = [keys.call(call_id), keys.lease(call_id)]
            return bool(self._republish(keys=script_keys, args=[expected, now_ms]))

    def reap(
        self, keys: RunKeys, reaps: Sequence[Reap], *, now_ms: int, writer: str
    ) -> tuple[int, list[str]]:
        """Apply the reaper's decisions on calls of one run (:func:`workers.core.waiting.reaps`).

        Returns how many calls were answered here and the ids of those taken back for another
        worker, whose task the caller sends again.
        """
        answered, resend = 0, []
        for reap in reaps:
            call = reap.call
            if reap.answer is not None:
                answered += self.finish(keys, reap.answer, now_ms=now_ms, writer=writer)
            elif reap.kind is ActionKind.REQUEUE:
                if self.requeue(keys, call.call_id, expected_attempt=call.attempt, now_ms=now_ms):
                    resend.append(call.call_id)
            elif self.count_republish(keys, call.call_id, expected=call.republishes, now_ms=now_ms):
                resend.append(call.call_id)
        return answered, resend

    def heartbeat(self, keys: RunKeys, call_id: str, *, now_ms: int, details: Any) -> None:
        """Record a tool's progress report (and so the run's progress)."""
        progress = json.dumps(details, default=str)[:2000]
        with store_errors():
            self._heartbeat(keys=[keys.call(call_id), keys.run], args=[now_ms, progress])

    def add_process_group(self, keys: RunKeys, call_id: str, pgid: int) -> None:
        """Remember a process group the tool started (killed by the main process on a hard end)."""
        with store_errors():
            self.client.hset(keys.call(call_id), pgid_field(pgid), "1")

    def process_groups(self, keys: RunKeys, call_id: str) -> list[int]:
        """Process groups recorded for a call."""
        with store_errors():
            fields = [str(f) for f in self.client.hkeys(keys.call(call_id))]
        return [pgid for f in fields if (pgid := pgid_of(f)) is not None]

    def renew_leases(self, calls: Sequence[tuple[RunKeys, str]], worker_id: str, *, now_ms: int) -> None:
        """Extend live leases and their scores in the lease index, in one round trip.

        ``XX`` on both: a finished call's lease, or its index member, is never brought back.
        A call not in the lease index yet (claimed soon after submission) is put there by the
        sweep's first look, by its lease's end as this renewal left it.
        """
        if not calls:
            return
        until = now_ms + self.lease_ttl_ms
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for keys, call_id in calls:
                pipe.set(keys.lease(call_id), worker_id, px=self.lease_ttl_ms, xx=True)
            buckets: dict[int, dict[str, int]] = {}
            for keys, call_id in calls:
                buckets.setdefault(keys.bucket, {})[keys.due_member(call_id)] = until
            for bucket, members in buckets.items():
                pipe.zadd(index_keys(self.prefix, bucket).leases, members, xx=True, gt=True)
            pipe.execute()

    def running_states(self, calls: Sequence[tuple[RunKeys, str]]) -> list[tuple[str, str, int]]:
        """(state, worker, last heartbeat ms) of each call, in one round trip; '' when unknown."""
        if not calls:
            return []
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for keys, call_id in calls:
                pipe.hmget(keys.call(call_id), _RUNNING_FIELDS)
            replies = pipe.execute()
        rows = [Row.zip(CALL, _RUNNING_FIELDS, reply) for reply in replies]
        return [
            (row.raw(CallField.STATE) or "", row.text(CallField.WORKER), row.integer(CallField.HB_MS))
            for row in rows
        ]

    def results(self, keys: RunKeys, call_ids: Sequence[str]) -> dict[str, ToolResult]:
        """The delivered results among ``call_ids``."""
        if not call_ids:
            return {}

        def read(seal: Seal) -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for call_id in call_ids:
                pipe.hget(keys.call(call_id), CallField.RESULT)
            seal(pipe)  # confirmed: what is handed on is on the replicas
            return pipe.execute()

        with store_errors():
            raw = self.replica_acks.confirmed(self.client, read, read=True, slot_key=keys.call(call_ids[0]))
        return {cid: ToolResult.from_json(r) for cid, r in zip(call_ids, raw, strict=True) if r}

    def wait_for_done(self, keys: RunKeys, timeout_s: float, *, mine: Collection[str] = ()) -> bool:
        """Block up to ``timeout_s`` for the next "a call of this run was answered" signal.

        One signal is consumed per wake; leftovers only cause cheap extra wakes, which is
        cheaper on the common single-answer path than draining the list every time. Several
        waiters may share a run (concurrent batches): a signal for a call not in ``mine`` is
        handed back once, marked, so its own waiter (served first: Redis wakes blocked
        clients in order) gets it at once instead of at its next check; a marked signal is
        never handed back again, so a stale one cannot circulate. A handed-back signal keeps the
        result it carries (see :mod:`workers.store.done_signals`).
        """
        return self.wait_for_results(keys, timeout_s, mine=mine, read=()) is not None

    def wait_for_results(
        self, keys: RunKeys, timeout_s: float, *, mine: Collection[str] = (), read: Sequence[str] = ()
    ) -> dict[str, ToolResult] | None:
        """:meth:`wait_for_done`, then the delivered results among ``read``.

        See :func:`workers.store.answer_wait.wait_for_results`.
        """
        found = wait_for_results(self.client, keys, timeout_s, mine=mine, read=read, ttl_s=self.ttl_s)
        # What the signal carried may not be on a replica yet: re-read it, confirmed.
        return self.results(keys, read) if found is not None and read and self.replica_acks.fencing else found

    def open_calls(self, keys: RunKeys, call_ids: Sequence[str]) -> list[OpenCall]:
        """Snapshot of the given calls that have no result yet (one round trip)."""
        if not call_ids:
            return []
        script_keys = [k for cid in call_ids for k in (keys.call(cid), keys.lease(cid))]
        with store_errors():
            replies = self._open(keys=script_keys, args=list(OPEN_FIELDS))
        calls = []
        for call_id, (lease_alive, reply) in zip(call_ids, replies, strict=True):
            row = Row.zip(CALL, OPEN_FIELDS, reply, where=keys.call(call_id))
            if CallField.CALL_ID in row:  # registered (not expired, not a stray write)
                calls.append(open_call(row, bool(lease_alive)))
        return [call for call in calls if call.state is not CallState.DONE]

    def run_call_ids(self, keys: RunKeys) -> list[str]:
        """Every call id of a run in submission order."""
        with store_errors():
            return [str(member) for member in self.client.zrange(keys.calls, 0, -1)]

    def record(self, keys: RunKeys, call_id: str) -> CallRecord | None:
        """The full record of one call, or None."""
        with store_errors():
            raw = self.client.hgetall(keys.call(call_id))
        return CallRecord.of(keys, call_id, {str(k): str(v) for k, v in raw.items()})

    def late_results(self, keys: RunKeys, call_id: str) -> list[ToolResult]:
        """Results that lost the race for a call (audit)."""
        with store_errors():
            raw = self.client.lrange(keys.late(call_id), 0, -1)
        return [ToolResult.from_json(r) for r in raw]
