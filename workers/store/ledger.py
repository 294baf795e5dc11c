"""The result ledger: one record per tool call, first-writer-wins results, leases, heartbeats.

One ledger on two clients: :class:`Ledger` on ``redis.Redis`` (workers, the watchdog, sync
gateways) and :class:`AsyncLedger` on ``redis.asyncio`` (asyncio gateways; a waiter blocked
there holds a connection, not a thread). Each change is built once, as a :class:`_Op`: a
script of the one script table, its ``KEYS`` and ``ARGV``, and the index commands pipelined
after it. The two classes only send it, so a record written through either is read the same
through the other. Every change is one Lua script over the keys of a single run (see
:mod:`workers.store.keys`); times come in as arguments, nothing here reads the clock.

**Waking a waiter.** The winning finish (``ledger_finish.lua``) pushes onto the run's ``done``
list a signal that carries its result: ``<result JSON> US <call id>``, ``US`` being the ASCII
unit separator U+001F, so the waiter it wakes has the answer without reading the record. JSON
never holds a raw U+001F (RFC 8259 escapes control characters in strings), so the first one
of a signal is the separator, whatever the call id holds, and JSON never starts with
:data:`HANDED_BACK`. A signal without a separator carries no result: its waiter reads the
record. A result carried is used only when it parses as the answer to the call it names
(:meth:`Signal.answer`), so an odd signal costs at worst a read, never a wrong answer.

One signal is consumed per wake; leftovers only cause cheap extra wakes. Several waiters may
share a run (concurrent batches): a signal for a call not in a waiter's ``mine`` is handed
back once, behind :data:`HANDED_BACK`, so its own waiter (served first: Redis wakes blocked
clients in order) gets it at once instead of at its next check; a marked signal is never
handed back again, so a stale one cannot circulate. A sync waiter blocks on its own
connection (:meth:`Ledger.wait_for_results`); asyncio waiters share one per event loop
(:class:`workers.store.done_listener.DoneListener`).

A client of :class:`AsyncLedger` belongs to the event loop it was first used on: open one per
loop (``workers.runtime.open_async_ledger``), and ``await aclose()`` it before that loop ends.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import redis
import redis.asyncio as aredis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from workers.core.models import CallState, ToolResult
from workers.core.reaping import ActionKind, OpenCall, Reap, next_look_ms, past_first_look
from workers.core.run_health import RunStatus
from workers.store._async import replica_sends as async_sends
from workers.store._sync import replica_sends
from workers.store.claims import Claim, claim_of
from workers.store.connection import store_errors
from workers.store.kept_answers import KeptAnswers
from workers.store.keys import (
    REFRESH_INTERVAL_S,
    IndexTtl,
    RunKeys,
    events_stream_key,
    index_keys,
    run_member,
)
from workers.store.lua import script_source
from workers.store.records import (
    CALL,
    OPEN_FIELDS,
    CallField,
    CallRecord,
    EventField,
    Row,
    open_call,
    pgid_field,
    pgid_of,
    reply_member,
)
from workers.store.replica_acks import ReplicaAcks, Seal, no_seal
from workers.store.run_indexes import RunKeysTtl


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

log = logging.getLogger(__name__)

#: Seconds between two refreshes of a run's calls/done TTLs (as the index keys' interval).
KEYS_REFRESH_S = REFRESH_INTERVAL_S
HANDED_BACK: Final = "\x00"  # marks a wake-up signal one waiter gave back to the run's other waiters
SEPARATOR: Final = "\x1f"  # between the result JSON and the call id ('\31' in ledger_finish.lua)
_EVENTS_MAXLEN = 10_000
_RUNNING_FIELDS = (CallField.STATE, CallField.WORKER, CallField.HB_MS)


def done_expire_s(ttl_s: int) -> int:
    """The TTL a run's ``done`` list (and ``calls``) gets when it is set."""
    return ttl_s + 2 * KEYS_REFRESH_S


# --- done signals ---------------------------------------------------------------------------------


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


def _stored_results(call_ids: Sequence[str], raw: Sequence[Any]) -> dict[str, ToolResult]:
    return {cid: ToolResult.from_json(r) for cid, r in zip(call_ids, raw, strict=True) if r}


# --- the script table and the operations built from it --------------------------------------------


@dataclass(frozen=True)
class _Script:
    text: str
    sha: str


# The script table, by file; True: it changes a call, so the run-summary helpers of
# lib_run_summary.lua are prepended (every writer keeps the run's summary the same way).
_SCRIPTS: Final = {
    "ledger_register.lua": True,
    "ledger_claim.lua": True,
    "ledger_finish.lua": True,
    "ledger_heartbeat.lua": True,
    "ledger_requeue.lua": True,
    "ledger_republish.lua": False,
    "ledger_open.lua": False,
    "session_touch.lua": False,
}


def _loaded(name: str) -> _Script:
    text = script_source(name, with_summary=_SCRIPTS[name])
    return _Script(text, hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest())


_SCRIPT_TABLE: Final = {name: _loaded(name) for name in _SCRIPTS}  # read once, at import


_Cmd = tuple[str, tuple[Any, ...], dict[str, Any]]  # a pipeline method, its arguments, its keywords


@dataclass(frozen=True)
class _Op:
    """One script run: what both ledgers send, in one round trip with ``then`` after it.

    ``decides``: a registration, a claim or a result, answered only once
    ``redis.min_replica_acks`` replicas hold it (:mod:`workers.store.replica_acks`).
    """

    script: str
    keys: list[str]
    args: list[Any]
    then: tuple[_Cmd, ...] = ()
    decides: bool = False

    def pipeline(self, pipe: Any, route: Mapping[str, Any]) -> None:
        """Add the script (``EVALSHA`` straight away: no ``SCRIPT EXISTS`` first) and ``then``."""
        evalsha = ("EVALSHA", _SCRIPT_TABLE[self.script].sha, len(self.keys), *self.keys, *self.args)
        pipe.execute_command(*evalsha, **route)
        for method, args, kwargs in self.then:
            getattr(pipe, method)(*args, **kwargs)


def _events_commands(prefix: str, ttl_s: int, kind: str, fields: Mapping[str, Any]) -> tuple[_Cmd, ...]:
    """An events-stream entry (kind, then every field as a string, JSON when not one), capped."""
    entry = {
        EventField.KIND: kind,
        **{k: v if isinstance(v, str) else json.dumps(v) for k, v in fields.items()},
    }
    key = events_stream_key(prefix)
    return (
        ("xadd", (key, entry), {"maxlen": _EVENTS_MAXLEN, "approximate": True}),
        ("expire", (key, ttl_s), {}),
    )


def _synthetic_event_fields(keys: RunKeys, result: ToolResult, writer: str) -> dict[str, Any]:
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


@dataclass(frozen=True)
class Registration:
    """Outcome of registering a call: whether it is new, and its run's state."""

    created: bool
    run_status: RunStatus
    guard_armed: bool

    @property
    def refused(self) -> bool:
        """The run no longer accepts calls (superseded, aborted, timed out or completed)."""
        return self.run_status is not RunStatus.RUNNING

    @classmethod
    def of(cls, reply: Any) -> Registration:
        """The register script's reply."""
        created, status, guard = reply
        # No status yet: the call comes before its run record (register opens no run).
        run_status = reply_member(RunStatus, status or RunStatus.RUNNING, where="ledger_register.lua")
        return cls(created == 1, run_status, int(guard) > 0)


def _open_calls(keys: RunKeys, call_ids: Sequence[str], replies: Sequence[Any]) -> list[OpenCall]:
    """The calls among an ``ledger_open.lua`` reply that are registered and have no result yet."""
    calls = []
    for call_id, (lease_alive, reply) in zip(call_ids, replies, strict=True):
        row = Row.zip(CALL, OPEN_FIELDS, reply, where=keys.call(call_id))
        if CallField.CALL_ID in row:  # registered (not expired, not a stray write)
            calls.append(open_call(row, bool(lease_alive)))
    return [call for call in calls if call.state is not CallState.DONE]


class _LedgerCore:
    """What both ledgers share: settings, listeners, and the operations they send."""

    def __init__(
        self,
        *,
        prefix: str,
        ttl_s: int,
        lease_ttl_ms: int,
        replica_acks: ReplicaAcks | None,
    ) -> None:
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

    def handed(self, keys: RunKeys, answers: dict[str, ToolResult]) -> dict[str, ToolResult]:
        """``answers``, handed on now: kept first when the primary had no replica in sync (reads do it)."""
        if self.kept is not None and answers and self.replica_acks.unacknowledged:
            pool = getattr(getattr(self, "client", None), "connection_pool", None)
            address = getattr(pool, "master_address", None)
            self.kept.keep(keys, answers, (str(address[0]), int(address[1])) if address else None)
        return answers

    def keys(self, session_key: str, run_id: str) -> RunKeys:
        """The key builder for one run."""
        return RunKeys(self.prefix, session_key, run_id)

    def _index_expire(self, key: str) -> tuple[_Cmd, ...]:
        # An index expires like everything else, after its last write (see IndexTtl).
        return (("expire", (key, self._index_ttl.expire_s), {}),) if self._index_ttl.due(key) else ()

    def _register(
        self,
        keys: RunKeys,
        call_id: str,
        *,
        now_ms: int,
        deadline_ms: int,
        fields: dict[str, str],
        push: tuple[str, str] | None,
    ) -> _Op:
        """``ledger_register.lua``, then the call's due-index entry.

        A nonce of its own goes last (field ``reg``): the same arguments sent again are the same
        registration. The indexes are hints the watchdog re-checks, so they are written even when
        the id existed or the run refused it. The call is due for the sweep's first look at its
        deadline, or one lease after submission when sooner: a call answered by then (most) is
        never looked at; a running one is put in the lease index then, a queued one is due again
        at its deadline, and one never dispatched (its gateway died before publishing) is found
        without waiting for its deadline.
        """
        undeclared = sorted(set(fields) - set(CALL.fields))
        if undeclared:
            raise ValueError(f"not fields of the call record: {undeclared}")
        flat = [item for pair in {**fields, CallField.CALL_ID: call_id}.items() for item in pair]
        script_keys, message = [keys.call(call_id), keys.calls, keys.run], ""
        if push is not None:
            script_keys.append(push[0])
            message = push[1]
        nonce = [CallField.REG.value, secrets.token_hex(8)]
        until_ms = self._keys_ttl.until_ms(deadline_ms)
        args = [call_id, now_ms, deadline_ms, self.ttl_s, KEYS_REFRESH_S, until_ms, message, *flat, *nonce]
        score = next_look_ms(deadline_ms, now_ms, self.lease_ttl_ms)
        due = keys.index.due
        then = (("zadd", (due, {keys.due_member(call_id): score}), {"nx": True}), *self._index_expire(due))
        return _Op("ledger_register.lua", script_keys, args, then, decides=True)

    def _finish(
        self, keys: RunKeys, result: ToolResult, *, now_ms: int, writer: str, lease_indexed: bool
    ) -> _Op:
        """``ledger_finish.lua``, then the call leaves the due index (and the lease index, if in it)."""
        call_id = result.tool_call_id
        script_keys = [keys.call(call_id), keys.late(call_id), keys.done, keys.run, keys.calls]
        args = [call_id, result.to_json(), result.reason or "", now_ms, self.ttl_s, writer, KEYS_REFRESH_S]
        member = keys.due_member(call_id)
        then: tuple[_Cmd, ...] = (("zrem", (keys.index.due, member), {}), *self._index_expire(keys.index.due))
        if lease_indexed:
            then += (("zrem", (keys.index.leases, member), {}),)
        return _Op("ledger_finish.lua", script_keys, args, then, decides=True)

    def _resend(self, keys: RunKeys, reap: Reap, now_ms: int) -> _Op:
        """Take back a lost call for another worker (requeue) or count one more publish of it.

        The script answers 1 when this caller should send the call's task again.
        """
        call = reap.call
        script_keys = [keys.call(call.call_id), keys.lease(call.call_id)]
        if reap.kind is ActionKind.REQUEUE:
            return _Op("ledger_requeue.lua", [*script_keys, keys.run], [call.attempt, now_ms])
        return _Op("ledger_republish.lua", script_keys, [call.republishes, now_ms])

    @staticmethod
    def _open(keys: RunKeys, call_ids: Sequence[str]) -> _Op:
        script_keys = [k for cid in call_ids for k in (keys.call(cid), keys.lease(cid))]
        return _Op("ledger_open.lua", script_keys, list(OPEN_FIELDS))

    def _stored_first(self, keys: RunKeys, result: ToolResult) -> None:
        """Tell the ``on_answered`` listeners; a listener never fails the write."""
        for listener in self.on_answered:
            try:
                listener(keys, result)
            except Exception as exc:  # noqa: BLE001 - a listener never makes a stored answer fail
                log.warning("answer listener failed for call %s: %s", result.tool_call_id, exc)


class Ledger(_LedgerCore):
    """The ledger on a sync client. All methods raise ``StoreError`` when Redis fails."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str,
        ttl_s: int,
        lease_ttl_ms: int,
        replica_acks: ReplicaAcks | None = None,
    ) -> None:
        super().__init__(prefix=prefix, ttl_s=ttl_s, lease_ttl_ms=lease_ttl_ms, replica_acks=replica_acks)
        self.client = client

    def close(self) -> None:
        """Release the client's connections (a later call reconnects)."""
        self.client.close()

    def _run(self, op: _Op) -> Any:
        """Send ``op``; its script's reply."""
        with store_errors():
            if op.decides:
                return replica_sends.confirmed(
                    self.replica_acks, self.client, lambda seal: self._send(op, seal), slot_key=op.keys[0]
                )[0]
            return self._send(op, no_seal)[0]

    def _send(self, op: _Op, seal: Seal) -> list[Any]:
        # By name, not pipe.evalsha: redis-py's cluster pipeline blocks that method.
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            op.pipeline(pipe, self._route(op.keys[0]))
            seal(pipe)
            try:
                return pipe.execute()
            except NoScriptError:  # a Redis restart lost the scripts: load, then once more
                if attempt == 2:
                    raise
                self.client.script_load(_SCRIPT_TABLE[op.script].text)
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
        op = self._register(keys, call_id, now_ms=now_ms, deadline_ms=deadline_ms, fields=fields, push=push)
        return Registration.of(self._run(op))

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
        (never claimed). A nonce of its own makes the same claim sent again the same claim. A
        claim within half a lease of submission writes no lease-index entry
        (:func:`~workers.core.waiting.past_first_look`): one command less per call; a later one
        puts the call in the lease index (a hint the sweep re-checks, even for a claim that
        found the call done or busy).
        """
        script_keys = [keys.call(call_id), keys.lease(call_id), keys.run]
        args = [now_ms, worker_id, self.lease_ttl_ms, tool, job_digest, secrets.token_hex(8)]
        then: tuple[_Cmd, ...] = ()
        if past_first_look(now_ms=now_ms, submitted_ms=submitted_ms, lease_ms=self.lease_ttl_ms):
            leases = keys.index.leases
            lease_end = {keys.due_member(call_id): now_ms + self.lease_ttl_ms}
            then = (("zadd", (leases, lease_end), {}), *self._index_expire(leases))
        return claim_of(self._run(_Op("ledger_claim.lua", script_keys, args, then, decides=True)))

    def finish(
        self, keys: RunKeys, result: ToolResult, *, now_ms: int, writer: str, submitted_ms: int | None = None
    ) -> bool:
        """Store ``result`` as it is if it is the first, else keep it as late; True when it won.

        ``result`` is what the agent is given: writers compose it with
        :func:`~workers.core.failure_policy.delivered` (``tools.fallbacks``) before they call this.
        ``submitted_ms``, when the writer knows it (the worker, from its message), spares the
        lease-index removal of a call answered within half a lease of submission, which was
        never put there.
        """
        indexed = past_first_look(now_ms=now_ms, submitted_ms=submitted_ms, lease_ms=self.lease_ttl_ms)
        won = bool(self._run(self._finish(keys, result, now_ms=now_ms, writer=writer, lease_indexed=indexed)))
        if won and result.synthetic:
            self.publish_event("synthetic", **_synthetic_event_fields(keys, result, writer))
        if won:
            self._stored_first(keys, result)
        return won

    def publish_event(self, kind: str, **fields: Any) -> None:
        """Append an event to the capped events stream (read by ``unstuck up``); best effort."""
        try:
            pipe = self.client.pipeline(transaction=False)
            for method, args, kwargs in _events_commands(self.prefix, self.ttl_s, kind, fields):
                getattr(pipe, method)(*args, **kwargs)
            pipe.execute()
        except redis.RedisError:
            pass  # an event is a convenience for operators, never a reason to fail a call

    def reap(
        self, keys: RunKeys, reaps: Sequence[Reap], *, now_ms: int, writer: str
    ) -> tuple[int, list[str]]:
        """Apply the reaper's decisions on calls of one run (:func:`workers.core.waiting.reaps`).

        Returns how many calls were answered here and the ids of those taken back for another
        worker, whose task the caller sends again.
        """
        answered, resend = 0, []
        for reap in reaps:
            if reap.answer is not None:
                answered += self.finish(keys, reap.answer, now_ms=now_ms, writer=writer)
            elif self._run(self._resend(keys, reap, now_ms)):
                resend.append(reap.call.call_id)
        return answered, resend

    def heartbeat(self, keys: RunKeys, call_id: str, *, now_ms: int, details: Any) -> None:
        """Record a tool's progress report (and so the run's progress)."""
        progress = json.dumps(details, default=str)[:2000]
        self._run(_Op("ledger_heartbeat.lua", [keys.call(call_id), keys.run], [now_ms, progress]))

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
            raw = replica_sends.confirmed(
                self.replica_acks, self.client, read, read=True, slot_key=keys.call(call_ids[0])
            )
            return self.handed(keys, _stored_results(call_ids, raw))

    def wait_for_results(
        self, keys: RunKeys, timeout_s: float, *, mine: Collection[str] = (), read: Sequence[str] = ()
    ) -> dict[str, ToolResult] | None:
        """Block up to ``timeout_s`` for the run's next done signal, then read the results among ``read``.

        None when no signal came within ``timeout_s``. A signal for a call not in ``mine`` is handed
        back once (see the module docstring). One ``BLPOP`` on the run's done list; the
        signal of the winning finish carries its result, so for one call nothing is read behind
        it: its own signal is its answer, and after any other the record is read in the round
        trip that may hand that signal back. For several calls the reads are pipelined behind
        the ``BLPOP`` on its connection, so Redis runs them the moment the signal is popped.
        """
        behind = read if len(read) > 1 else ()
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.blpop([keys.done], timeout=max(0.01, timeout_s))
            for call_id in behind:
                pipe.hget(keys.call(call_id), CallField.RESULT)
            popped, *raw = pipe.execute()
            if popped is None:
                return None
            signal = Signal.parse(str(popped[1]))
            answers = _stored_results(behind, raw)
            if signal.call_id in read and (inline := signal.answer()) is not None:
                answers[signal.call_id] = inline
            follow = [] if behind else [cid for cid in read if cid not in answers]
            answers.update(self._after_signal(keys, signal, mine, follow))
        # What the signal carried may not be on a replica yet: re-read it, confirmed.
        return self.results(keys, read) if read and self.replica_acks.fencing else self.handed(keys, answers)

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
        return _stored_results(follow, replies[len(replies) - len(follow) :])

    def open_calls(self, keys: RunKeys, call_ids: Sequence[str]) -> list[OpenCall]:
        """Snapshot of the given calls that have no result yet (one round trip)."""
        return _open_calls(keys, call_ids, self._run(self._open(keys, call_ids))) if call_ids else []

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


# --- the asyncio client ---------------------------------------------------------------------------


class AsyncLedger(_LedgerCore):
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
        super().__init__(prefix=prefix, ttl_s=ttl_s, lease_ttl_ms=lease_ttl_ms, replica_acks=replica_acks)
        self.client = client
        self.registering = registering or client
        self.registering_slots = int(getattr(self.registering.connection_pool, "max_connections", 1))
        self._listener = listener

    async def aclose(self) -> None:
        """Close the clients' connections and the listener's (on the loop they belong to)."""
        await self._listener.aclose()
        if self.registering is not self.client:
            await self.registering.aclose()
        await self.client.aclose()

    async def _run(self, op: _Op, client: aredis.Redis | None = None) -> Any:
        """Send ``op`` (on ``client``, default the ledger's); its script's reply (as :meth:`Ledger._run`)."""
        on = client or self.client
        with store_errors():
            if op.decides:
                return (
                    await async_sends.confirmed(self.replica_acks, on, lambda seal: self._send(op, seal, on))
                )[0]
            return (await self._send(op, no_seal, on))[0]

    async def _send(self, op: _Op, seal: Seal, client: aredis.Redis) -> list[Any]:
        for attempt in (1, 2):
            pipe = client.pipeline(transaction=False)
            op.pipeline(pipe, {})
            seal(pipe)
            try:
                return await pipe.execute()
            except NoScriptError:  # a Redis restart lost the scripts: load, then once more
                if attempt == 2:
                    raise
                await client.script_load(_SCRIPT_TABLE[op.script].text)
            except BaseException:
                self._index_ttl.forget()  # the EXPIREs it carried may not have run
                raise
        return []

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
        """:meth:`Ledger.register_call`, awaited."""
        op = self._register(keys, call_id, now_ms=now_ms, deadline_ms=deadline_ms, fields=fields, push=push)
        return Registration.of(await self._run(op, self.registering))

    async def finish(self, keys: RunKeys, result: ToolResult, *, now_ms: int, writer: str) -> bool:
        """:meth:`Ledger.finish`, awaited (the writer does not know ``submitted_ms``)."""
        won = bool(
            await self._run(self._finish(keys, result, now_ms=now_ms, writer=writer, lease_indexed=True))
        )
        if won and result.synthetic:
            await self.publish_event("synthetic", **_synthetic_event_fields(keys, result, writer))
        if won:
            self._stored_first(keys, result)
        return won

    async def publish_event(self, kind: str, **fields: Any) -> None:
        """:meth:`Ledger.publish_event`, awaited; best effort."""
        try:
            pipe = self.client.pipeline(transaction=False)
            for method, args, kwargs in _events_commands(self.prefix, self.ttl_s, kind, fields):
                getattr(pipe, method)(*args, **kwargs)
            await pipe.execute()
        except redis.RedisError:
            pass  # an event is a convenience for operators, never a reason to fail a call

    async def reap(
        self, keys: RunKeys, reaps: Sequence[Reap], *, now_ms: int, writer: str
    ) -> tuple[int, list[str]]:
        """:meth:`Ledger.reap`, awaited."""
        answered, resend = 0, []
        for reap in reaps:
            if reap.answer is not None:
                answered += await self.finish(keys, reap.answer, now_ms=now_ms, writer=writer)
            elif await self._run(self._resend(keys, reap, now_ms)):
                resend.append(reap.call.call_id)
        return answered, resend

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

        with store_errors():
            answers = _stored_results(
                call_ids, await async_sends.confirmed(self.replica_acks, self.client, read, read=True)
            )
        return self.handed(keys, answers)

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

    async def open_calls(self, keys: RunKeys, call_ids: Sequence[str]) -> list[OpenCall]:
        """Snapshot of the given calls that have no result yet (one round trip)."""
        return _open_calls(keys, call_ids, await self._run(self._open(keys, call_ids))) if call_ids else []

    async def run_call_ids(self, keys: RunKeys) -> list[str]:
        """Every call id of a run in submission order."""
        with store_errors():
            return [str(member) for member in await self.client.zrange(keys.calls, 0, -1)]

    async def touch_progress(self, keys: RunKeys, now_ms: int) -> bool:
        """Record progress of a run (as ``SessionStore.touch_progress``); False once it stopped running.

        The progress index moves in the same round trip even if the run stopped: ``XX GT`` never
        adds a member nor moves one back, so an ended run's entry is left as it was or moved forward.
        """
        member = {run_member(keys.session_key, keys.run_id): now_ms}
        then: tuple[_Cmd, ...] = (("zadd", (keys.index.by_progress, member), {"xx": True, "gt": True}),)
        return bool(await self._run(_Op("session_touch.lua", [keys.run], [now_ms], then)))
