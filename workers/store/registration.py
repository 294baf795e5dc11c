"""A call's registration in the ledger: the register script's keys, arguments, index step and reply.

One definition for :meth:`workers.store.ledger.Ledger.register_call` and its asyncio twin
(:meth:`workers.store.aledger.AsyncLedger.register_call`), so a change to the script's
arguments reaches both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from workers.core.run_health import RunStatus
from workers.core.waiting import next_look_ms
from workers.store.index_ttl import IndexTtl
from workers.store.keys import RunKeys
from workers.store.ledger_args import ScriptCall, register_call
from workers.store.records import CALL, CallField
from workers.store.rows import reply_member

__all__ = ["RegisterStep", "Registration"]


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


class _IndexPipe(Protocol):
    """What the registration's index step needs of a pipeline (sync or asyncio)."""

    def zadd(self, name: str, mapping: Mapping[str, int], nx: bool = ...) -> Any: ...
    def expire(self, name: str, time: int) -> Any: ...


@dataclass(frozen=True)
class RegisterStep:
    """One call's registration: the script's keys and arguments, its index step and its reply.

    Shared by :meth:`Ledger.register_call` and the asyncio ledger's twin, so a change to the
    register script's arguments reaches both.
    """

    keys: RunKeys
    call_id: str
    now_ms: int
    deadline_ms: int
    fields: dict[str, str]
    ttl_s: int
    push: tuple[str, str] | None = None  # a broker queue's list and the call's message

    def __post_init__(self) -> None:
        undeclared = sorted(set(self.fields) - set(CALL.fields))
        if undeclared:
            raise ValueError(f"not fields of the call record: {undeclared}")

    @property
    def script_call(self) -> ScriptCall:
        """``KEYS`` and ``ARGV`` of ledger_register.lua (built where every ledger script's are)."""
        flat = [item for pair in {**self.fields, CallField.CALL_ID: self.call_id}.items() for item in pair]
        return register_call(
            self.keys,
            self.call_id,
            now_ms=self.now_ms,
            deadline_ms=self.deadline_ms,
            ttl_s=self.ttl_s,
            fields=flat,
            push=self.push,
        )

    def index(self, pipe: _IndexPipe, index_ttl: IndexTtl, lease_ttl_ms: int) -> None:
        """The index write pipelined after the script.

        The indexes are hints the watchdog re-checks, so they may be written even when the id
        existed or the run refused it. The call is due for the sweep's first look at its
        deadline, or one lease after submission when that is sooner: a call answered by then
        (most) is never looked at; a running one is put in the lease index then (by its
        lease's real end) and a queued one is due again at its deadline; one never dispatched
        (its gateway died before publishing) is found without waiting for its deadline.
        """
        keys, member = self.keys, self.keys.due_member(self.call_id)
        score = next_look_ms(self.deadline_ms, self.now_ms, lease_ttl_ms)
        pipe.zadd(keys.index.due, {member: score}, nx=True)
        if index_ttl.due(keys.index.due):
            pipe.expire(keys.index.due, index_ttl.expire_s)

    def registration(self, reply: Any) -> Registration:
        """The script's reply as a :class:`Registration`."""
        created, status, guard = reply
        # No status yet: the call comes before its run record (register opens no run).
        run_status = reply_member(RunStatus, status or RunStatus.RUNNING, where="ledger_register.lua")
        return Registration(created == 1, run_status, int(guard) > 0)
