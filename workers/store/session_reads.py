"""Reading lanes, run records, run indexes and the activity of a run's calls.

:class:`SessionReads` is the read half of :class:`~workers.store.sessions.SessionStore`; every
record is read by its declared field names (:mod:`workers.store.records`). Every method raises
``StoreError`` when Redis fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis

from workers.core.models import CallState
from workers.core.run_health import CallActivity
from workers.store.connection import store_errors
from workers.store.keys import (
    RunKeys,
    SessionKeys,
    all_index_keys,
    lane_pattern,
    parse_lane_key,
    parse_run_member,
)
from workers.store.ledger import Ledger
from workers.store.records import CALL, LANE, RUN, CallField, LaneField, RunField
from workers.store.rows import Row

__all__ = ["RECENT_CALLS", "Lane", "RunInfo", "SessionReads"]

RECENT_CALLS = 20
_OLDER_PAGE = 200  # calls read per step past the recent ones, when the run counts more open


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


def _scored(member: Any, score: Any) -> tuple[str, str, int]:
    session_key, run_id = parse_run_member(str(member))
    return session_key, run_id, int(score)


def _run_info(session_key: str, run_id: str, row: Row[RunField]) -> RunInfo:
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


def _lane(session_key: str, row: Row[LaneField]) -> Lane:
    return Lane(
        session_key=session_key,
        run_id=row.text(LaneField.RUN_ID),
        token=row.integer(LaneField.TOKEN),
        agent_id=row.text(LaneField.AGENT_ID),
        since_ms=row.integer(LaneField.SINCE_MS),
        lease_until_ms=row.integer(LaneField.LEASE_UNTIL_MS),
    )


_ACTIVITY_FIELDS = (
    CallField.STATE, CallField.TOOL, CallField.SUBMITTED_MS, CallField.STARTED_MS, CallField.HB_MS,
    CallField.FINISHED_MS, CallField.DISPATCHED,
)  # fmt: skip


def _activity(call_id: str, row: Row[CallField], lease_alive: bool) -> CallActivity:
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


class SessionReads:
    """The reads of lanes, run records and run indexes (see :class:`SessionStore` for writes)."""

    client: redis.Redis
    ledger: Ledger
    prefix: str

    def run_keys(self, session_key: str, run_id: str) -> RunKeys:
        """The key builder of one run."""
        return RunKeys(self.prefix, session_key, run_id)

    def session(self, session_key: str) -> SessionKeys:
        """The key builder of one session."""
        return SessionKeys(self.prefix, session_key)

    def holds_lane(self, session_key: str, run_id: str, token: int) -> bool:
        """Whether ``run_id`` still holds its session's lane with ``token`` (the fencing check)."""
        lane = self.lane(session_key)
        return lane is not None and lane.run_id == run_id and lane.token == token

    def lane(self, session_key: str) -> Lane | None:
        """The lane of a session, or None when free."""
        key = self.session(session_key).lane
        with store_errors():
            raw = self.client.hgetall(key)
        return _lane(session_key, Row(LANE, raw, where=key)) if raw else None

    def run(self, session_key: str, run_id: str) -> RunInfo | None:
        """One run record, or None when it does not exist (or expired)."""
        found = self.runs([(session_key, run_id)])
        return found[0] if found else None

    def runs(self, pairs: Sequence[tuple[str, str]]) -> list[RunInfo]:
        """Run records of (session, run) pairs, in one round trip; missing ones are skipped."""
        keys = [RunKeys(self.prefix, session_key, run_id).run for session_key, run_id in pairs]
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.hgetall(key)
            replies = pipe.execute() if pairs else []
        return [
            _run_info(session_key, run_id, Row(RUN, raw, where=key))
            for (session_key, run_id), key, raw in zip(pairs, keys, replies, strict=True)
            if raw
        ]

    def _members(
        self, index: Literal["by_deadline", "by_progress"], low: float, high: float, limit: int
    ) -> list[tuple[str, str, int]]:
        """Up to ``limit`` members of a run index over all its buckets, lowest score first."""
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for keys in all_index_keys(self.prefix):
                pipe.zrangebyscore(getattr(keys, index), low, high, start=0, num=limit, withscores=True)
            rows: list[Any] = [row for bucket in pipe.execute() for row in bucket]
        rows.sort(key=lambda row: row[1])
        return [_scored(m, score) for m, score in rows[:limit]]

    def past_deadline(self, now_ms: int, limit: int) -> list[tuple[str, str, int]]:
        """Running runs whose deadline has passed: (session, run, deadline ms)."""
        return self._members("by_deadline", float("-inf"), now_ms, limit)

    def quiet_since(self, before_ms: int, limit: int) -> list[tuple[str, str, int]]:
        """Running runs with no indexed progress after ``before_ms``: (session, run, progress ms)."""
        return self._members("by_progress", float("-inf"), before_ms, limit)

    def running(self, limit: int) -> list[tuple[str, str, int]]:
        """Indexed running runs, oldest progress first: (session, run, progress ms)."""
        return self._members("by_progress", float("-inf"), float("inf"), limit)

    def ended(self, limit: int) -> list[tuple[str, str, int]]:
        """Recently ended runs, newest first: (session, run, end ms)."""
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for keys in all_index_keys(self.prefix):
                pipe.zrevrange(keys.ended, 0, limit - 1, withscores=True)
            rows: list[Any] = [row for bucket in pipe.execute() for row in bucket]
        rows.sort(key=lambda row: row[1], reverse=True)
        return [_scored(m, score) for m, score in rows[:limit]]

    def find_session(self, session_key: str, limit: int = 100_000) -> RunInfo | None:
        """The session's current run (lane holder), else its latest run found in the indexes."""
        lane = self.lane(session_key)
        if lane is not None and (info := self.run(session_key, lane.run_id)) is not None:
            return info
        candidates = [(s, r) for s, r, _ in self.running(limit) + self.ended(limit) if s == session_key]
        infos = self.runs(candidates)
        return max(infos, key=lambda info: info.started_ms, default=None)

    def activity(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], list[CallActivity]]:
        """Recent and open calls of each run, with their real activity times (two round trips).

        The ``RECENT_CALLS`` latest calls of each run; a run whose summary counts more open
        calls than those show (a batch wider than that, or an old call still hanging) is read
        further back, page by page, until they are all found.
        """
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for session_key, run_id in pairs:
                keys = RunKeys(self.prefix, session_key, run_id)
                pipe.zrevrange(keys.calls, 0, RECENT_CALLS - 1)
                pipe.hget(keys.run, RunField.OPEN_N)
            raw = pipe.execute() if pairs else []
        out: dict[tuple[str, str], list[CallActivity]] = {pair: [] for pair in pairs}
        out.update(self._activities([(pair, str(cid)) for n, pair in enumerate(pairs) for cid in raw[2 * n]]))
        for n, pair in enumerate(pairs):
            missing = int(raw[2 * n + 1] or 0) - sum(call.open for call in out[pair])
            if missing > 0 and len(raw[2 * n]) == RECENT_CALLS:
                out[pair].extend(self._older_open_calls(pair, missing))
        return out

    def _activities(
        self, wanted: Sequence[tuple[tuple[str, str], str]]
    ) -> dict[tuple[str, str], list[CallActivity]]:
        """The activity of each (run, call id) still registered, by run (one round trip)."""
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for (session_key, run_id), call_id in wanted:
                keys = RunKeys(self.prefix, session_key, run_id)
                pipe.hmget(keys.call(call_id), _ACTIVITY_FIELDS)
                pipe.exists(keys.lease(call_id))
            replies = pipe.execute() if wanted else []
        out: dict[tuple[str, str], list[CallActivity]] = {pair: [] for pair, _ in wanted}
        for n, (pair, call_id) in enumerate(wanted):
            row = Row.zip(CALL, _ACTIVITY_FIELDS, replies[2 * n])
            if CallField.STATE in row:  # still registered
                out[pair].append(_activity(call_id, row, bool(replies[2 * n + 1])))
        return out

    def _older_open_calls(self, pair: tuple[str, str], missing: int) -> list[CallActivity]:
        """Up to ``missing`` open calls of a run older than its ``RECENT_CALLS`` latest."""
        keys = RunKeys(self.prefix, *pair)
        found: list[CallActivity] = []
        start = RECENT_CALLS
        while len(found) < missing:
            with store_errors():
                ids = self.client.zrevrange(keys.calls, start, start + _OLDER_PAGE - 1)
            if not ids:
                break
            page = self._activities([(pair, str(call_id)) for call_id in ids]).get(pair, [])
            found.extend(call for call in page if call.open)
            start += _OLDER_PAGE
        return found[:missing]

    def lanes(self, count: int = 1000) -> list[Lane]:
        """Every lane lock (SCAN: for the operator's ``locks`` command, not for sweeps)."""
        found: list[Lane] = []
        with store_errors():
            for key in self.client.scan_iter(match=lane_pattern(self.prefix), count=count):
                raw = self.client.hgetall(key)
                if raw:
                    row = Row(LANE, raw, where=str(key))
                    found.append(_lane(parse_lane_key(self.prefix, str(key)), row))
        return found
