"""The loop history: its record type, the storage protocol and an in-memory implementation.

History is kept **per run** (``session_key`` + ``run_id``), so one run's activity can never
evict another run's records (OpenClaw trims per session; heartbeat and cron runs then
inherit stale counts).

Storage rule shared by every implementation, so that a call that is appended and then
vetoed leaves the history exactly as if it had never been appended (OpenClaw never
records a blocked call): the store keeps at most ``history_size + 1`` records, and every
read (the window a call is judged against, the search for a pending call's record) looks
only at the newest ``history_size`` records, excluding the call being judged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from workers.core.loops.guard import GuardState, GuardTriple, arm_guard, observe_guard
from workers.core.loops.signals import WindowSignals, signals_of

__all__ = [
    "WARNING_KEY_LIMIT",
    "HistoryEntry",
    "InMemoryLoopHistory",
    "LoopHistory",
    "RunScope",
]

# Warning de-duplication remembers at most this many keys per run.
WARNING_KEY_LIMIT = 256


@dataclass(frozen=True)
class RunScope:
    """Which history a call belongs to: one session's run (``run_id`` empty when unscoped)."""

    session_key: str
    run_id: str = ""


@dataclass(frozen=True)
class HistoryEntry:
    """One recorded call and, once executed, the hash of its outcome."""

    seq: int
    tool_name: str
    args_hash: str
    tool_call_id: str | None = None
    run_id: str | None = None
    result_hash: str | None = None
    unknown_tool_name: str | None = None
    timestamp_ms: int = 0

    def to_json(self) -> str:
        """Compact JSON form, as stored in Redis (short keys keep members small)."""
        fields = {
            "s": self.seq,
            "t": self.tool_name,
            "a": self.args_hash,
            "c": self.tool_call_id,
            "r": self.run_id,
            "h": self.result_hash,
            "u": self.unknown_tool_name,
            "ts": self.timestamp_ms,
        }
        return json.dumps({k: v for k, v in fields.items() if v is not None}, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> HistoryEntry:
        """Parse the stored JSON form."""
        return cls.from_dict(json.loads(raw))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HistoryEntry:
        """Build from the decoded short-key form of :meth:`to_json`."""
        return cls(
            seq=int(data["s"]),
            tool_name=str(data["t"]),
            args_hash=str(data["a"]),
            tool_call_id=data.get("c"),
            run_id=data.get("r"),
            result_hash=data.get("h"),
            unknown_tool_name=data.get("u"),
            timestamp_ms=int(data.get("ts", 0)),
        )


class LoopHistory(Protocol):
    """Per-run storage for loop detection; each method is one atomic round trip."""

    def record_call(
        self, scope: RunScope, entry: HistoryEntry, history_size: int, now_ms: int
    ) -> tuple[list[HistoryEntry], int]:
        """Append a pending call; return the window it is judged against and its assigned seq."""
        ...

    def check_call(
        self, scope: RunScope, entry: HistoryEntry, history_size: int, evidence_at: int, now_ms: int
    ) -> tuple[WindowSignals, int]:
        """:meth:`record_call`, returning the window's signals for ``entry`` instead of the window.

        The signals are those :func:`~workers.core.loops.signals.signals_of` computes from the
        window (``entry``'s tool, args hash and run id; ``evidence_at`` as given).
        """
        ...

    def discard_call(self, scope: RunScope, seq: int) -> None:
        """Remove a call appended by :meth:`record_call` that was then blocked."""
        ...

    def record_outcome(
        self,
        scope: RunScope,
        entry: HistoryEntry,
        history_size: int | None,
        observe: GuardTriple | None,
        now_ms: int,
    ) -> tuple[GuardTriple, ...] | None:
        """Attach an outcome hash and feed the guard; return the guard window, or None if dormant.

        The outcome attaches to the newest pending record of the same call id (when given),
        tool and args hash within the window; otherwise a fresh record is appended.
        ``history_size`` None skips the history (detection off); ``observe`` None skips the guard.
        """
        ...

    def arm_guard(self, scope: RunScope, window_size: int, now_ms: int) -> None:
        """Arm (or re-arm) the post-compaction guard of a run for ``window_size`` outcomes."""
        ...

    def disarm_guard(self, scope: RunScope) -> None:
        """Disarm the post-compaction guard of a run."""
        ...

    def note_warning(self, scope: RunScope, key: str, bucket: int, now_ms: int) -> bool:
        """Record a warning's bucket; True when it exceeds the last bucket (the warning is emitted)."""
        ...


@dataclass
class _RunState:
    records: list[HistoryEntry] = field(default_factory=list)
    next_seq: int = 1
    guard: GuardState | None = None
    warnings: dict[str, int] = field(default_factory=dict)


class InMemoryLoopHistory:
    """A :class:`LoopHistory` in a dict; for tests, the replay CLI and single-process use."""

    def __init__(self) -> None:
        self._runs: dict[RunScope, _RunState] = {}

    def _state(self, scope: RunScope) -> _RunState:
        return self._runs.setdefault(scope, _RunState())

    def entries(self, scope: RunScope) -> list[HistoryEntry]:
        """Every stored record of a run, oldest first (for tests)."""
        return list(self._state(scope).records)

    def record_call(
        self, scope: RunScope, entry: HistoryEntry, history_size: int, now_ms: int
    ) -> tuple[list[HistoryEntry], int]:
        """Append a pending call; return the window it is judged against and its assigned seq."""
        state = self._state(scope)
        window = state.records[-history_size:]
        seq = state.next_seq
        state.next_seq += 1
        state.records.append(replace(entry, seq=seq, timestamp_ms=now_ms))
        del state.records[: -(history_size + 1)]
        return window, seq

    def check_call(
        self, scope: RunScope, entry: HistoryEntry, history_size: int, evidence_at: int, now_ms: int
    ) -> tuple[WindowSignals, int]:
        """:meth:`record_call`, returning the window's signals for ``entry`` instead of the window."""
        window, seq = self.record_call(scope, entry, history_size, now_ms)
        signals = signals_of(
            window,
            tool=entry.tool_name,
            args_hash=entry.args_hash,
            run_id=entry.run_id,
            evidence_at=evidence_at,
        )
        return signals, seq

    def discard_call(self, scope: RunScope, seq: int) -> None:
        """Remove a call appended by :meth:`record_call` that was then blocked."""
        state = self._state(scope)
        state.records = [record for record in state.records if record.seq != seq]

    def record_outcome(
        self,
        scope: RunScope,
        entry: HistoryEntry,
        history_size: int | None,
        observe: GuardTriple | None,
        now_ms: int,
    ) -> tuple[GuardTriple, ...] | None:
        """Attach an outcome hash and feed the guard; return the guard window, or None if dormant."""
        state = self._state(scope)
        if history_size is not None:
            self._attach(state, entry, history_size, now_ms)
        if observe is None or state.guard is None:
            return None
        state.guard, window = observe_guard(state.guard, observe)
        return window

    @staticmethod
    def _attach(state: _RunState, entry: HistoryEntry, history_size: int, now_ms: int) -> None:
        records = state.records
        start = max(0, len(records) - history_size)
        for index in range(len(records) - 1, start - 1, -1):
            if _is_pending_match(records[index], entry):
                records[index] = replace(
                    records[index], result_hash=entry.result_hash, unknown_tool_name=entry.unknown_tool_name
                )
                break
        else:
            records.append(replace(entry, seq=state.next_seq, timestamp_ms=now_ms))
            state.next_seq += 1
        del records[:-history_size]

    def arm_guard(self, scope: RunScope, window_size: int, now_ms: int) -> None:
        """Arm (or re-arm) the post-compaction guard of a run for ``window_size`` outcomes."""
        self._state(scope).guard = arm_guard(window_size)

    def disarm_guard(self, scope: RunScope) -> None:
        """Disarm the post-compaction guard of a run."""
        self._state(scope).guard = None

    def note_warning(self, scope: RunScope, key: str, bucket: int, now_ms: int) -> bool:
        """Record a warning's bucket; True when it exceeds the last bucket (the warning is emitted)."""
        warnings = self._state(scope).warnings
        if bucket <= warnings.get(key, 0):
            return False
        if key not in warnings and len(warnings) >= WARNING_KEY_LIMIT:
            del warnings[next(iter(warnings))]
        warnings[key] = bucket
        return True


def _is_pending_match(record: HistoryEntry, entry: HistoryEntry) -> bool:
    return (
        record.result_hash is None
        and record.tool_name == entry.tool_name
        and record.args_hash == entry.args_hash
        and (entry.tool_call_id is None or record.tool_call_id == entry.tool_call_id)
    )
