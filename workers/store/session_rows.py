"""Session and run records as read: the rows of lanes, runs and calls made into values.

Pure conversions from :class:`workers.store.records.Row`; :mod:`workers.store.sessions` reads
the rows and re-exports :class:`Lane` and :class:`RunInfo`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workers.core.models import CallState
from workers.core.run_health import CallActivity
from workers.store.keys import parse_run_member
from workers.store.records import CallField, LaneField, Row, RunField

__all__ = ["ACTIVITY_FIELDS", "Lane", "RunInfo", "activity_of", "lane_of", "run_info_of", "scored"]


@dataclass(frozen=True)
class Lane:
    """Who holds a session's lane."""

    session_key: str
    run_id: str
    token: int
    agent_id: str
    since_ms: int
    lease_until_ms: int


@dataclass(frozen=True)
class RunInfo:
    """A run record as stored."""

    session_key: str
    run_id: str
    agent_id: str
    status: str  # a RunStatus value, or '' for a record no gateway opened
    started_ms: int
    deadline_ms: int
    progress_ms: int
    token: int
    klass: str
    ended_ms: int
    end_reason: str
    open_calls: int = 0
    claimed_calls: int = 0
    agent_beat_ms: int = 0  # the agent's own last heartbeat (a model turn streaming)
    agent_beat_what: str = ""
    stream_idles: int = 0  # model streams that went idle past their timeout


def scored(member: Any, score: Any) -> tuple[str, str, int]:
    """(session, run, score) of a run index member and its score."""
    session_key, run_id = parse_run_member(str(member))
    return session_key, run_id, int(score)


def run_info_of(session_key: str, run_id: str, row: Row[RunField]) -> RunInfo:
    """The :class:`RunInfo` of a run record's row."""
    started = row.integer(RunField.STARTED_MS)
    return RunInfo(
        session_key=session_key,
        run_id=run_id,
        agent_id=row.text(RunField.AGENT_ID),
        status=row.text(RunField.STATUS),
        started_ms=started,
        deadline_ms=row.integer(RunField.DEADLINE_MS),
        progress_ms=row.integer(RunField.PROGRESS_MS) or started,
        token=row.integer(RunField.TOKEN),
        klass=row.text(RunField.CLASS),
        ended_ms=row.integer(RunField.ENDED_MS),
        end_reason=row.text(RunField.END_REASON),
        open_calls=max(0, row.integer(RunField.OPEN_N)),
        claimed_calls=max(0, row.integer(RunField.CLAIMED_N)),
        agent_beat_ms=row.integer(RunField.AGENT_BEAT_MS),
        agent_beat_what=row.text(RunField.AGENT_BEAT_WHAT),
        stream_idles=row.integer(RunField.STREAM_IDLE_N),
    )


def lane_of(session_key: str, row: Row[LaneField]) -> Lane:
    """The :class:`Lane` of a lane's row."""
    return Lane(
        session_key=session_key,
        run_id=row.text(LaneField.RUN_ID),
        token=row.integer(LaneField.TOKEN),
        agent_id=row.text(LaneField.AGENT_ID),
        since_ms=row.integer(LaneField.SINCE_MS),
        lease_until_ms=row.integer(LaneField.LEASE_UNTIL_MS),
    )


ACTIVITY_FIELDS = (
    CallField.STATE, CallField.TOOL, CallField.SUBMITTED_MS, CallField.STARTED_MS, CallField.HB_MS,
    CallField.FINISHED_MS, CallField.DISPATCHED,
)  # fmt: skip


def activity_of(call_id: str, row: Row[CallField], lease_alive: bool) -> CallActivity:
    """What the watchdog needs of one call: its row of :data:`ACTIVITY_FIELDS` and whether its lease lives."""
    return CallActivity(
        call_id=call_id,
        tool=row.text(CallField.TOOL),
        state=row.member(CallField.STATE, CallState),
        submitted_ms=row.integer(CallField.SUBMITTED_MS),
        started_ms=row.integer(CallField.STARTED_MS),
        heartbeat_ms=row.integer(CallField.HB_MS),
        finished_ms=row.integer(CallField.FINISHED_MS),
        lease_alive=lease_alive,
        dispatched=row.flag(CallField.DISPATCHED),
    )
