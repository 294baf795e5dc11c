"""The result ledger: one record per tool call, first-writer-wins results, leases, heartbeats.

Every multi-step change is one Lua script over the keys of a single run (see
:mod:`workers.store.keys`). Times come in as arguments; nothing here reads the clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis
from redis.client import Pipeline
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from workers.core.models import CallState, ToolResult
from workers.core.reaper import OpenCall
from workers.errors import StoreError
from workers.store.keys import RunKeys, due_index_key, events_stream_key

__all__ = [
    "CallRecord",
    "Claim",
    "Ledger",
    "Registration",
    "RunAbort",
    "RunState",
    "connect",
    "ensure_run",
    "mark_run_aborted",
    "open_run",
    "run_abort",
    "store_errors",
]


def _script_text(name: str) -> str:
    return resources.files("workers.store").joinpath("scripts", name).read_text(encoding="utf-8")


@contextmanager
def store_errors() -> Iterator[None]:
    """Turn redis-py connection and protocol errors into ``StoreError``."""
    try:
        yield
    except redis.RedisError as exc:
        raise StoreError(f"redis: {type(exc).__name__}: {exc}") from exc


def connect(url: str, *, socket_timeout_s: float, socket_connect_timeout_s: float) -> redis.Redis:
    """A client for ``url`` with bounded timeouts, so no store call can hang a caller."""
    if not url:
        raise StoreError("no Redis URL configured: set UNSTUCK_REDIS__URL or start `unstuck up`")
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=socket_connect_timeout_s,
        health_check_interval=5,
        decode_responses=True,
    )


@dataclass(frozen=True)
class Claim:
    """Outcome of a worker's claim: ``claimed`` (run it), ``done`` or ``busy`` (do not)."""

    status: str
    attempt: int


@dataclass(frozen=True)
class Registration:
    """Outcome of registering a call: whether it is new, and its run's state."""

    created: bool
    run_status: str
    guard_armed: bool

    @property
    def refused(self) -> bool:
        """The run no longer accepts calls (superseded, aborted, timed out or completed)."""
        return self.run_status != "running"


@dataclass(frozen=True)
class CallRecord:
    """A call as the ledger holds it."""

    call_id: str
    tool: str
    state: CallState
    result: ToolResult | None
    fields: dict[str, str]


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class Ledger:
    """Redis access for call records. All methods raise ``StoreError`` when Redis fails."""

    def __init__(self, client: redis.Redis, *, prefix: str, ttl_s: int, lease_ttl_ms: int) -> None:
        self.client = client
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.lease_ttl_ms = lease_ttl_ms
        self._register = client.register_script(_script_text("ledger_register.lua"))
        self._claim = client.register_script(_script_text("ledger_claim.lua"))
        self._finish = client.register_script(_script_text("ledger_finish.lua"))
        self._requeue = client.register_script(_script_text("ledger_requeue.lua"))
        self._open = client.register_script(_script_text("ledger_open.lua"))

    def _pipelined(
        self, script: Script, keys: list[str], args: list[Any], then: Callable[[Pipeline], None]
    ) -> Any:
        """Run ``script`` and one more command in a single round trip; returns the script's reply.

        ``EVALSHA`` goes straight into the pipeline (redis-py would first ask ``SCRIPT EXISTS``,
        an extra round trip); after a Redis restart that lost its scripts, load and retry once.
        """
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            then(pipe)
            try:
                return pipe.execute()[0]
            except NoScriptError:
                if attempt == 2:
                    raise
                self.client.script_load(script.script)
        return None

    def _index_due(self, pipe: Pipeline, members: dict[str, int]) -> None:
        # The index expires like everything else, refreshed on every write.
        pipe.zadd(due_index_key(self.prefix), members, nx=True)
        pipe.expire(due_index_key(self.prefix), self.ttl_s)

    def _unindex_due(self, pipe: Pipeline, member: str) -> None:
        pipe.zrem(due_index_key(self.prefix), member)
        pipe.expire(due_index_key(self.prefix), self.ttl_s)

    def keys(self, session_key: str, run_id: str) -> RunKeys:
        """The key builder for one run."""
        return RunKeys(self.prefix, session_key, run_id)

    def register(
        self, keys: RunKeys, call_id: str, *, now_ms: int, deadline_ms: int, fields: dict[str, str]
    ) -> bool:
        """Record a new call; False when the id was already registered (do not dispatch again)."""
        return self.register_call(
            keys, call_id, now_ms=now_ms, deadline_ms=deadline_ms, fields=fields
        ).created

    def register_call(
        self, keys: RunKeys, call_id: str, *, now_ms: int, deadline_ms: int, fields: dict[str, str]
    ) -> Registration:
        """Record a new call and read its run's status and guard state, in one round trip."""
        flat = [item for pair in {**fields, "call_id": call_id}.items() for item in pair]
        with store_errors():
            # The due index is a hint the watchdog re-checks, so it may be added even when
            # the id existed or the run refused it.
            created, status, guard = self._pipelined(
                self._register,
                [keys.call(call_id), keys.calls, keys.open, keys.run],
                [call_id, now_ms, deadline_ms, self.ttl_s, *flat],
                lambda pipe: self._index_due(pipe, {keys.due_member(call_id): deadline_ms}),
            )
        return Registration(created == 1, str(status or "running"), int(guard) > 0)

    def mark_dispatched(self, keys: RunKeys, call_id: str, task_id: str) -> None:
        """Note that the broker accepted the call's message."""
        with store_errors():
            self.client.hset(keys.call(call_id), mapping={"dispatched": "1", "task_id": task_id})

    def claim(self, keys: RunKeys, call_id: str, *, worker_id: str, now_ms: int) -> Claim:
        """Claim a call for running; a finished call is never claimed again."""
        with store_errors():
            status, attempt = self._claim(
                keys=[keys.call(call_id), keys.lease(call_id)],
                args=[now_ms, worker_id, self.lease_ttl_ms, self.ttl_s],
            )
        return Claim(str(status), int(attempt))

    def finish(self, keys: RunKeys, result: ToolResult, *, now_ms: int, writer: str) -> bool:
        """Store ``result`` if it is the first; otherwise keep it as late. True when it won."""
        call_id = result.tool_call_id
        with store_errors():
            won = self._pipelined(
                self._finish,
                [keys.call(call_id), keys.late(call_id), keys.open, keys.done, keys.lease(call_id)],
                [call_id, result.to_json(), result.reason or "", now_ms, self.ttl_s, writer],
                lambda pipe: self._unindex_due(pipe, keys.due_member(call_id)),
            )
        if won and result.synthetic:
            self.publish_event(
                "synthetic",
                session=keys.session_key,
                run=keys.run_id,
                call=call_id,
                tool=result.tool_name,
                reason=result.reason or "",
                writer=writer,
                elapsed_s=round(int(result.details.get("elapsed_ms", 0)) / 1000, 2),
            )
        return bool(won)

    def publish_event(self, kind: str, **fields: Any) -> None:
        """Append an event to the capped events stream (read by ``unstuck up``); best effort."""
        entry = {
            "kind": kind,
            **{k: json.dumps(v) if not isinstance(v, str) else v for k, v in fields.items()},
        }
        key = events_stream_key(self.prefix)
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.xadd(key, entry, maxlen=10_000, approximate=True)  # type: ignore[arg-type]
            pipe.expire(key, self.ttl_s)
            pipe.execute()
        except redis.RedisError:
            pass  # an event is a convenience for operators, never a reason to fail a call

    def requeue(self, keys: RunKeys, call_id: str, *, expected_attempt: int) -> bool:
        """Make a lost idempotent call pending again; True when this caller should re-dispatch."""
        with store_errors():
            return bool(
                self._requeue(keys=[keys.call(call_id), keys.lease(call_id)], args=[expected_attempt])
            )

    def heartbeat(self, keys: RunKeys, call_id: str, *, now_ms: int, details: Any) -> None:
        """Record a tool's progress report."""
        progress = json.dumps(details, default=str)[:2000]
        with store_errors():
            self.client.hset(keys.call(call_id), mapping={"hb_ms": now_ms, "progress": progress})

    def add_process_group(self, keys: RunKeys, call_id: str, pgid: int) -> None:
        """Remember a process group the tool started (killed by the main process on a hard end)."""
        with store_errors():
            self.client.hset(keys.call(call_id), f"pgid:{pgid}", "1")

    def process_groups(self, keys: RunKeys, call_id: str) -> list[int]:
        """Process groups recorded for a call."""
        with store_errors():
            fields = [str(f) for f in self.client.hkeys(keys.call(call_id))]
        return [int(f.split(":", 1)[1]) for f in fields if f.startswith("pgid:")]

    def renew_leases(self, lease_keys: Sequence[str], worker_id: str) -> None:
        """Extend live leases (``XX``: a finished call's lease is never brought back)."""
        if not lease_keys:
            return
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for key in lease_keys:
                pipe.set(key, worker_id, px=self.lease_ttl_ms, xx=True)
            pipe.execute()

    def running_states(self, calls: Sequence[tuple[RunKeys, str]]) -> list[tuple[str, str, int]]:
        """(state, worker, last heartbeat ms) of each call, in one round trip; '' when unknown."""
        if not calls:
            return []
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for keys, call_id in calls:
                pipe.hmget(keys.call(call_id), ["state", "worker", "hb_ms"])
            rows = pipe.execute()
        return [(str(state or ""), str(worker or ""), _int(hb)) for state, worker, hb in rows]

    def results(self, keys: RunKeys, call_ids: Sequence[str]) -> dict[str, ToolResult]:
        """The delivered results among ``call_ids``."""
        if not call_ids:
            return {}
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for call_id in call_ids:
                pipe.hget(keys.call(call_id), "result")
            raw = pipe.execute()
        return {cid: ToolResult.from_json(r) for cid, r in zip(call_ids, raw, strict=True) if r}

    def wait_for_done(self, keys: RunKeys, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` for the next "a call of this run was answered" signal.

        One signal is consumed per wake; leftovers only cause cheap extra wakes, which is
        cheaper on the common single-answer path than draining the list every time.
        """
        with store_errors():
            return self.client.blpop([keys.done], timeout=max(0.01, timeout_s)) is not None

    def open_calls(self, keys: RunKeys, call_ids: Sequence[str]) -> list[OpenCall]:
        """Snapshot of the given calls that have no result yet (one round trip)."""
        if not call_ids:
            return []
        script_keys = [k for cid in call_ids for k in (keys.call(cid), keys.lease(cid))]
        with store_errors():
            rows = self._open(keys=script_keys, args=[])
        return [_open_call(row) for row in rows if row[1] != CallState.DONE.value]

    def run_call_ids(self, keys: RunKeys) -> list[str]:
        """Every call id of a run in submission order."""
        with store_errors():
            return [str(member) for member in self.client.zrange(keys.calls, 0, -1)]

    def record(self, keys: RunKeys, call_id: str) -> CallRecord | None:
        """The full record of one call, or None."""
        with store_errors():
            raw = self.client.hgetall(keys.call(call_id))
        fields = {str(k): str(v) for k, v in raw.items()}
        if not fields:
            return None
        result = ToolResult.from_json(fields["result"]) if "result" in fields else None
        return CallRecord(
            call_id, fields.get("tool", ""), CallState(fields.get("state", "pending")), result, fields
        )

    def late_results(self, keys: RunKeys, call_id: str) -> list[ToolResult]:
        """Results that lost the race for a call (audit)."""
        with store_errors():
            raw = self.client.lrange(keys.late(call_id), 0, -1)
        return [ToolResult.from_json(r) for r in raw]


def _open_call(row: list[Any]) -> OpenCall:
    call_id, state, deadline, attempt, lease, idempotent, dispatched, submitted = row[:8]
    return OpenCall(
        call_id=str(call_id),
        tool=str(row[10] or ""),
        state=CallState(state or "pending"),
        deadline_ms=_int(deadline),
        attempt=_int(attempt),
        lease_alive=bool(_int(lease)),
        idempotent=idempotent == "1",
        dispatched=dispatched == "1",
        submitted_ms=_int(submitted),
    )


def ensure_run(ledger: Ledger, keys: RunKeys, *, now_ms: int, deadline_ms: int, agent_id: str) -> int:
    """Create the run record on first use; returns the run's deadline (ms)."""
    return open_run(ledger, keys, now_ms=now_ms, deadline_ms=deadline_ms, agent_id=agent_id).deadline_ms


@dataclass(frozen=True)
class RunState:
    """What a batch of calls needs to know about its run, read in one round trip."""

    deadline_ms: int
    abort: RunAbort | None
    guard_armed: bool


def open_run(ledger: Ledger, keys: RunKeys, *, now_ms: int, deadline_ms: int, agent_id: str) -> RunState:
    """Create the run record on first use and read its deadline, abort and guard state."""
    with store_errors():
        pipe = ledger.client.pipeline(transaction=True)
        pipe.hsetnx(keys.run, "started_ms", now_ms)
        pipe.hsetnx(keys.run, "deadline_ms", deadline_ms)
        pipe.hsetnx(keys.run, "agent_id", agent_id)
        pipe.hsetnx(keys.run, "status", "running")
        pipe.expire(keys.run, ledger.ttl_s)
        fields = [
            "deadline_ms",
            "status",
            "abort_detector",
            "abort_count",
            "abort_message",
            "guard_remaining",
        ]
        pipe.hmget(keys.run, fields)
        stored, status, detector, count, message, guard = pipe.execute()[-1]
    loop_abort = status == "aborted" and detector
    abort = RunAbort(str(detector), _int(count), str(message or "")) if loop_abort else None
    return RunState(_int(stored, deadline_ms), abort, _int(guard) > 0)


def run_abort(ledger: Ledger, keys: RunKeys) -> RunAbort | None:
    """The loop detector's abort record of a run, or None."""
    with store_errors():
        status, detector, count, message = ledger.client.hmget(
            keys.run, ["status", "abort_detector", "abort_count", "abort_message"]
        )
    if status != "aborted" or not detector:
        return None
    return RunAbort(str(detector), _int(count), str(message or ""))


@dataclass(frozen=True)
class RunAbort:
    """Why a run was aborted by the loop detector."""

    detector: str
    count: int
    message: str


def mark_run_aborted(ledger: Ledger, keys: RunKeys, abort: RunAbort, *, now_ms: int) -> None:
    """Mark the run aborted (later calls of the run are answered without running)."""
    with store_errors():
        pipe = ledger.client.pipeline(transaction=True)
        pipe.hset(
            keys.run,
            mapping={
                "status": "aborted",
                "aborted_ms": now_ms,
                "abort_detector": abort.detector,
                "abort_count": abort.count,
                "abort_message": abort.message,
            },
        )
        pipe.expire(keys.run, ledger.ttl_s)
        pipe.execute()
