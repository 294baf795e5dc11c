"""Run records as the gateway sees them: created on first use, deadline, loop-abort state.

Lanes, fencing and the watchdog's view of runs live in :mod:`workers.store.sessions`; the
key schema in :mod:`workers.store.keys`.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.core.run_health import RunStatus
from workers.store.connection import store_errors
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger
from workers.store.lua import load_script
from workers.store.records import RUN, RunField
from workers.store.rows import Row
from workers.store.sessions import SessionStore

__all__ = [
    "AgentBeats",
    "RunAbort",
    "RunState",
    "ensure_run",
    "mark_run_aborted",
    "open_run",
    "run_abort",
]


def ensure_run(ledger: Ledger, keys: RunKeys, *, now_ms: int, deadline_ms: int, agent_id: str) -> int:
    """Create the run record on first use; returns the run's deadline (ms)."""
    return open_run(ledger, keys, now_ms=now_ms, deadline_ms=deadline_ms, agent_id=agent_id).deadline_ms


@dataclass(frozen=True)
class RunState:
    """What a batch of calls needs to know about its run, read in one round trip."""

    deadline_ms: int
    abort: RunAbort | None
    guard_armed: bool


_ABORT_FIELDS = (RunField.STATUS, RunField.ABORT_DETECTOR, RunField.ABORT_COUNT, RunField.ABORT_MESSAGE)
_OPEN_FIELDS = (RunField.DEADLINE_MS, RunField.GUARD_REMAINING, *_ABORT_FIELDS)


def open_run(ledger: Ledger, keys: RunKeys, *, now_ms: int, deadline_ms: int, agent_id: str) -> RunState:
    """Create the run record on first use and read its deadline, abort and guard state."""
    with store_errors():
        pipe = ledger.client.pipeline(transaction=True)
        pipe.hsetnx(keys.run, RunField.STARTED_MS, now_ms)
        pipe.hsetnx(keys.run, RunField.DEADLINE_MS, deadline_ms)
        pipe.hsetnx(keys.run, RunField.AGENT_ID, agent_id)
        pipe.hsetnx(keys.run, RunField.STATUS, RunStatus.RUNNING)
        pipe.expire(keys.run, ledger.ttl_s)
        pipe.hmget(keys.run, _OPEN_FIELDS)
        row = Row.zip(RUN, _OPEN_FIELDS, pipe.execute()[-1], where=keys.run)
    # The deadline was set just above unless the record had one: never missing in practice.
    stored = row.maybe_integer(RunField.DEADLINE_MS)
    guard_armed = row.integer(RunField.GUARD_REMAINING) > 0
    return RunState(deadline_ms if stored is None else stored, _abort(row), guard_armed)


def _abort(row: Row[RunField]) -> RunAbort | None:
    detector = row.text(RunField.ABORT_DETECTOR)
    if row.text(RunField.STATUS) != RunStatus.ABORTED or not detector:
        return None
    return RunAbort(detector, row.integer(RunField.ABORT_COUNT), row.text(RunField.ABORT_MESSAGE))


def run_abort(ledger: Ledger, keys: RunKeys) -> RunAbort | None:
    """The loop detector's abort record of a run, or None."""
    with store_errors():
        reply = ledger.client.hmget(keys.run, _ABORT_FIELDS)
    return _abort(Row.zip(RUN, _ABORT_FIELDS, reply, where=keys.run))


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
                RunField.STATUS: RunStatus.ABORTED,
                RunField.ABORTED_MS: now_ms,
                RunField.ABORT_DETECTOR: abort.detector,
                RunField.ABORT_COUNT: abort.count,
                RunField.ABORT_MESSAGE: abort.message,
            },
        )
        pipe.expire(keys.run, ledger.ttl_s)
        pipe.execute()


class AgentBeats:
    """The agent's own liveness on its run record: heartbeats and streams that went idle.

    A heartbeat raises the run's progress (and its place in the progress index) like tool
    activity does, so a run whose model is thinking or streaming is never stalled or stuck.
    """

    def __init__(self, sessions: SessionStore) -> None:
        self.sessions = sessions
        self._beat = load_script(sessions.client, "run_agent_beat.lua")

    def heartbeat(self, keys: RunKeys, *, now_ms: int, what: str) -> bool:
        """Record that the agent is alive; False once the run ended (or never existed)."""
        with store_errors():
            running = bool(self._beat(keys=[keys.run], args=[now_ms, what[:64], "0"]))
            if running:
                self.sessions.index_progress(keys.session_key, keys.run_id, now_ms)
        return running

    def stream_idle(self, keys: RunKeys, *, now_ms: int) -> bool:
        """Count a model stream that went idle past its timeout; False when the run is not running."""
        with store_errors():
            return bool(self._beat(keys=[keys.run], args=[now_ms, "", "1"]))
