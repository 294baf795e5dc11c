"""The ledger's script table and the operations built from it, shared by both of its clients.

Each change of the ledger is built once, as an :class:`Op`: a script of the one script table,
its ``KEYS`` and ``ARGV``, and the index commands pipelined after it. The clients
(:mod:`workers.store._async.ledger_client` and the sync one generated from it) only send it,
so a record written through either is read the same through the other. Every change is one
Lua script over the keys of a single run (see :mod:`workers.store.keys`); times come in as
arguments, nothing here reads the clock.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from workers.core.models import CallState, ToolResult
from workers.core.reaping import ActionKind, OpenCall, Reap
from workers.core.run_health import RunStatus
from workers.store.keys import RunKeys, events_stream_key, run_member
from workers.store.lua import script_source
from workers.store.records import CALL, OPEN_FIELDS, CallField, EventField, Row, open_call, reply_member

__all__ = [
    "RUNNING_FIELDS",
    "SCRIPT_TABLE",
    "Cmd",
    "Op",
    "Registration",
    "events_commands",
    "nonce",
    "open_calls_of",
    "open_op",
    "resend_op",
    "synthetic_event_fields",
    "touch_op",
]

_EVENTS_MAXLEN = 10_000
RUNNING_FIELDS = (CallField.STATE, CallField.WORKER, CallField.HB_MS)


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


SCRIPT_TABLE: Final = {name: _loaded(name) for name in _SCRIPTS}  # read once, at import


class _Nonces:
    """Nonces unique across processes and time: a random prefix per process, then a counter.

    A registration or a claim carries one so that the same write sent again (redis-py's retry
    after a lost reply) is recognised as the same. ``secrets.token_hex`` per write read the
    kernel's random source each time: a visible share of a pool child's claim under load.
    """

    def __init__(self) -> None:
        self.renew()

    def renew(self) -> None:
        self._prefix = secrets.token_hex(6)
        self._count = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._count):x}"  # next() on a count is atomic under the GIL


_NONCES = _Nonces()
os.register_at_fork(after_in_child=_NONCES.renew)  # a forked child must not repeat its parent's


def nonce() -> str:
    """A nonce for one registration or claim (see :class:`_Nonces`)."""
    return _NONCES.next()


Cmd = tuple[str, tuple[Any, ...], dict[str, Any]]  # a pipeline method, its arguments, its keywords


@dataclass(frozen=True)
class Op:
    """One script run: what both ledger clients send, in one round trip with ``then`` after it.

    ``decides``: a registration, a claim or a result, answered only once
    ``redis.min_replica_acks`` replicas hold it (:mod:`workers.store.replica_acks`).
    """

    script: str
    keys: list[str]
    args: list[Any]
    then: tuple[Cmd, ...] = ()
    decides: bool = False

    def pipeline(self, pipe: Any, route: Mapping[str, Any]) -> None:
        """Add the script (``EVALSHA`` straight away: no ``SCRIPT EXISTS`` first) and ``then``.

        By name, not ``pipe.evalsha``: redis-py's cluster pipeline blocks that method.
        """
        evalsha = ("EVALSHA", SCRIPT_TABLE[self.script].sha, len(self.keys), *self.keys, *self.args)
        pipe.execute_command(*evalsha, **route)
        for method, args, kwargs in self.then:
            getattr(pipe, method)(*args, **kwargs)


def events_commands(prefix: str, ttl_s: int, kind: str, fields: Mapping[str, Any]) -> tuple[Cmd, ...]:
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


def synthetic_event_fields(keys: RunKeys, result: ToolResult, writer: str) -> dict[str, Any]:
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


def resend_op(keys: RunKeys, reap: Reap, now_ms: int) -> Op:
    """Take back a lost call for another worker (requeue) or count one more publish of it.

    The script answers 1 when this caller should send the call's task again.
    """
    call = reap.call
    script_keys = [keys.call(call.call_id), keys.lease(call.call_id)]
    if reap.kind is ActionKind.REQUEUE:
        return Op("ledger_requeue.lua", [*script_keys, keys.run], [call.attempt, now_ms])
    return Op("ledger_republish.lua", script_keys, [call.republishes, now_ms])


def open_op(keys: RunKeys, call_ids: Sequence[str]) -> Op:
    """``ledger_open.lua`` over ``call_ids``: each call's open fields and whether its lease lives."""
    script_keys = [k for cid in call_ids for k in (keys.call(cid), keys.lease(cid))]
    return Op("ledger_open.lua", script_keys, list(OPEN_FIELDS))


def open_calls_of(keys: RunKeys, call_ids: Sequence[str], replies: Sequence[Any]) -> list[OpenCall]:
    """The calls among an ``ledger_open.lua`` reply that are registered and have no result yet."""
    calls = []
    for call_id, (lease_alive, reply) in zip(call_ids, replies, strict=True):
        row = Row.zip(CALL, OPEN_FIELDS, reply, where=keys.call(call_id))
        if CallField.CALL_ID in row:  # registered (not expired, not a stray write)
            calls.append(open_call(row, bool(lease_alive)))
    return [call for call in calls if call.state is not CallState.DONE]


def touch_op(keys: RunKeys, now_ms: int) -> Op:
    """Record progress of a run (``session_touch.lua``), the progress index moved behind it.

    The index moves in the same round trip even if the run stopped: ``XX GT`` never adds a
    member nor moves one back, so an ended run's entry is left as it was or moved forward.
    """
    member = {run_member(keys.session_key, keys.run_id): now_ms}
    then: tuple[Cmd, ...] = (("zadd", (keys.index.by_progress, member), {"xx": True, "gt": True}),)
    return Op("session_touch.lua", [keys.run], [now_ms], then)
