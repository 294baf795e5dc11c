"""Run records as the gateway sees them: created on first use, deadline, loop-abort state.

Lanes, fencing and the watchdog's view of runs live in :mod:`workers.store.sessions`; the
key schema in :mod:`workers.store.keys`.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.store.keys import RunKeys
from workers.store.ledger import Ledger, parse_int, store_errors
from workers.store.lua import load_script
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
    abort = RunAbort(str(detector), parse_int(count), str(message or "")) if loop_abort else None
    return RunState(parse_int(stored, deadline_ms), abort, parse_int(guard) > 0)


def run_abort(ledger: Ledger, keys: RunKeys) -> RunAbort | None:
    """The loop detector's abort record of a run, or None."""
    with store_errors():
        status, detector, count, message = ledger.client.hmget(
            keys.run, ["status", "abort_detector", "abort_count", "abort_message"]
        )
    if status != "aborted" or not detector:
        return None
    return RunAbort(str(detector), parse_int(count), str(message or ""))


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
