"""Sessions and runs: one active run per session (a lane with a lease and a fencing token).

* **Lane.** ``begin_run`` takes the session's lane for a run and returns a fencing token,
  strictly increasing per session. A newer run of the session supersedes the holder: the
  old run is marked ``aborted`` (reason ``superseded``) and its unanswered calls are answered
  ``cancelled`` at once, so its waiting gateway gets exactly one result per call. Queued tasks
  of those calls need no revocation for correctness: a worker's claim of an answered call
  returns ``done`` and never runs the tool. A superseded run cannot write its run record
  again: ``touch_progress`` and ``end_run`` return False once it is no longer running.
* **Lease.** A lane expires by itself at its run's deadline plus a margin.
* **Run record.** Start, deadline, last progress, status ``running|completed|aborted|
  timed_out``, token and the watchdog's last class, in the run's hash. The gateway begins and
  opens it on first use (``begin_and_open``: ``session_start.lua`` returns its deadline, loop
  abort and guard state); the agent's own heartbeats go there too (:class:`AgentBeats`).
* **Indexes.** Running runs are members of two global sorted sets, by deadline and by last
  progress, so a sweep reads only the runs that are due (O(due), not O(sessions)). They are
  hints: every decision re-reads the run record. Members are removed when a run ends
  (:class:`workers.store.run_indexes.RunIndexes`, one script each way).

The fields of each record are declared in :mod:`workers.store.records`, and read by name.
Multi-slot updates (lane, run record, indexes) are ordered single-slot atomic steps; see
:mod:`workers.store.keys` for why. On one node a run's end is one round trip and its beginning
three (the status read, the lane, then the record and its indexes together). Times come in as
arguments; nothing here reads the clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from workers.core.run_health import CallActivity, RunStatus
from workers.store.connection import store_errors
from workers.store.keys import (
    RunKeys,
    SessionKeys,
    all_index_keys,
    index_keys,
    lane_pattern,
    member_bucket,
    parse_lane_key,
    run_member,
    sweep_lock_key,
)
from workers.store.ledger import Ledger, done_expire_s
from workers.store.lua import ScriptStep, load_script, run_scripts
from workers.store.records import CALL, LANE, RUN, CallField, Row, RunField
from workers.store.run_indexes import RunIndexes
from workers.store.session_rows import (
    ACTIVITY_FIELDS,
    Lane,
    RunInfo,
    activity_of,
    lane_of,
    run_info_of,
    scored,
)

__all__ = [
    "RECENT_CALLS",
    "AgentBeats",
    "Lane",
    "RunAbort",
    "RunInfo",
    "RunState",
    "SessionStore",
    "ensure_run",
    "mark_run_aborted",
    "open_run",
    "run_abort",
]

LANE_LEASE_MARGIN_MS = 60_000
RECENT_CALLS = 20
_OLDER_PAGE = 200  # calls read per step past the recent ones, when the run counts more open


# -- run records as the gateway sees them: created on first use, deadline, loop-abort state ---


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
_OPEN_FIELDS = (
    RunField.DEADLINE_MS,
    RunField.GUARD_REMAINING,
    *_ABORT_FIELDS,
)  # session_start.lua's reply too


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
    return _state(row, deadline_ms if stored is None else stored)


def _state(row: Row[RunField], deadline_ms: int) -> RunState:
    """A run's state from a row of its deadline, guard and abort fields."""
    return RunState(deadline_ms, _abort(row), row.integer(RunField.GUARD_REMAINING) > 0)


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
        pipe.expire(keys.done, done_expire_s(ledger.ttl_s))  # no gateway waits on an aborted run
        pipe.execute()


class SessionStore:
    """Redis access for lanes, run records and run indexes; raises ``StoreError`` on Redis failure."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.client = ledger.client
        self.prefix = ledger.prefix
        self._acquire = load_script(self.client, "session_acquire.lua")
        self._release = load_script(self.client, "session_release.lua")
        self._start = load_script(self.client, "session_start.lua")
        self._end = load_script(self.client, "session_end.lua")
        self._done_ttl_s = done_expire_s(ledger.ttl_s)
        self._indexes = RunIndexes(self.client, ledger.ttl_s)
        self._unlock = load_script(self.client, "session_unlock.lua")

    # -- reads: lanes, run records, run indexes, the activity of a run's calls ------------------

    def run_keys(self, session_key: str, run_id: str) -> RunKeys:
        """The key builder of one run."""
        return RunKeys(self.prefix, session_key, run_id)

    def session(self, session_key: str) -> SessionKeys:
        """The key builder of one session."""
        return SessionKeys(self.prefix, session_key)

    def lane(self, session_key: str) -> Lane | None:
        """The lane of a session, or None when free."""
        key = self.session(session_key).lane
        with store_errors():
            raw = self.client.hgetall(key)
        return lane_of(session_key, Row(LANE, raw, where=key)) if raw else None

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
            run_info_of(session_key, run_id, Row(RUN, raw, where=key))
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
        return [scored(m, score) for m, score in rows[:limit]]

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
        return [scored(m, score) for m, score in rows[:limit]]

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
                pipe.hmget(keys.call(call_id), ACTIVITY_FIELDS)
                pipe.exists(keys.lease(call_id))
            replies = pipe.execute() if wanted else []
        out: dict[tuple[str, str], list[CallActivity]] = {pair: [] for pair, _ in wanted}
        for n, (pair, call_id) in enumerate(wanted):
            row = Row.zip(CALL, ACTIVITY_FIELDS, replies[2 * n])
            if CallField.STATE in row:  # still registered
                out[pair].append(activity_of(call_id, row, bool(replies[2 * n + 1])))
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
                    found.append(lane_of(parse_lane_key(self.prefix, str(key)), row))
        return found

    # -- the gateway's calls ------------------------------------------------------------------

    def begin_run(
        self,
        session_key: str,
        run_id: str,
        agent_id: str,
        now_ms: int,
        deadline_ms: int,
        *,
        answer_superseded: Callable[[RunKeys], object] | None = None,
    ) -> int:
        """Take the session's lane for ``run_id``; returns its fencing token, 0 if the run already ended.

        Idempotent for the run holding the lane. A run holding the lane before is superseded:
        marked ``aborted``, then ``answer_superseded`` answers its unanswered calls (the
        answering service's ``cancelled``; without it they are answered by their deadline).
        """
        token, _ = self._begin(session_key, run_id, agent_id, now_ms, deadline_ms, answer_superseded)
        return token

    def begin_and_open(
        self,
        session_key: str,
        run_id: str,
        agent_id: str,
        now_ms: int,
        deadline_ms: int,
        *,
        answer_superseded: Callable[[RunKeys], object] | None = None,
    ) -> RunState:
        """:meth:`begin_run`, and the run's deadline, abort and guard state from the same round trips.

        What :func:`open_run` reads after a begin: ``session_start.lua`` returns it, so a batch
        opening its run needs no read of its own. A run that already ended is read once.
        """
        _, state = self._begin(session_key, run_id, agent_id, now_ms, deadline_ms, answer_superseded)
        if state is not None:
            return state
        keys = RunKeys(self.prefix, session_key, run_id)  # ended before this begin
        return open_run(self.ledger, keys, now_ms=now_ms, deadline_ms=deadline_ms, agent_id=agent_id)

    def _begin(
        self,
        session_key: str,
        run_id: str,
        agent_id: str,
        now_ms: int,
        deadline_ms: int,
        answer_superseded: Callable[[RunKeys], object] | None,
    ) -> tuple[int, RunState | None]:
        """The lane's token (0: the run ended before) and, when begun, the run's state."""
        run_keys = RunKeys(self.prefix, session_key, run_id)
        sess = self.session(session_key)
        with store_errors():
            status = self.client.hget(run_keys.run, RunField.STATUS)
            if status and status != RunStatus.RUNNING.value:
                return 0, None
            lease_until = max(deadline_ms, now_ms) + LANE_LEASE_MARGIN_MS
            token, previous, prev_token = self._acquire(
                keys=[sess.lane, sess.fence],
                args=[run_id, agent_id, now_ms, lease_until, self.ledger.ttl_s],
            )
            started = self._start_indexed(run_keys, token, now_ms, deadline_ms, agent_id)
        if previous:
            self._supersede(session_key, str(previous), int(prev_token), now_ms, answer_superseded)
        return int(token), _state(started, started.integer(RunField.DEADLINE_MS) or deadline_ms)

    def _start_indexed(
        self, keys: RunKeys, token: int, now_ms: int, deadline_ms: int, agent_id: str
    ) -> Row[RunField]:
        """``session_start.lua``'s reply; the run entered its indexes in the same round trip.

        They are entered with ``deadline_ms``, and again with the deadline the run kept when it
        began before with another (its indexes are hints: every decision re-reads the run).
        """
        start = ScriptStep(self._start, [keys.run], [token, now_ms, deadline_ms, agent_id, self.ledger.ttl_s])
        reply, _ = self._run_steps(start, self._indexes.entering(keys, now_ms, deadline_ms=deadline_ms))
        started = Row.zip(RUN, _OPEN_FIELDS, reply, where=keys.run)
        stored = started.integer(RunField.DEADLINE_MS)
        if stored and stored != deadline_ms:
            self._run_steps(self._indexes.entering(keys, now_ms, deadline_ms=stored))
        return started

    def _run_steps(self, *steps: ScriptStep) -> list[Any]:
        """Run scripts over the lane, the run and its indexes in one round trip (see ``run_scripts``)."""
        try:
            return run_scripts(self.client, steps)
        except BaseException:
            self._indexes.failed()
            raise

    def touch_progress(self, session_key: str, run_id: str, now_ms: int) -> bool:
        """Record progress of a run in one round trip; False once it no longer runs (superseded or ended)."""
        return self.ledger.touch_progress(RunKeys(self.prefix, session_key, run_id), now_ms)

    def index_progress(self, session_key: str, run_id: str, now_ms: int) -> None:
        """Move a run forward in the progress index (never back; never adds a member)."""
        with store_errors():
            member, index = run_member(session_key, run_id), self.run_keys(session_key, run_id).index
            self.client.zadd(index.by_progress, {member: now_ms}, xx=True, gt=True)

    def end_run(
        self,
        session_key: str,
        run_id: str,
        status: RunStatus,
        now_ms: int,
        *,
        reason: str = "",
        token: int | None = None,
        release: bool = True,
    ) -> bool:
        """End a running run once; returns False when it had ended already or ``token`` is not its.

        With ``release`` the lane is freed and the run leaves the indexes at once; without it
        the caller answers the run's calls first, then calls :meth:`close_run`.
        """
        keys = RunKeys(self.prefix, session_key, run_id)
        expected = "" if token is None else str(token)
        end = ScriptStep(
            self._end, [keys.run, keys.done], [status.value, now_ms, reason, expected, self._done_ttl_s]
        )
        with store_errors():
            # Ending, freeing the lane and leaving the indexes: ordered steps, one round trip.
            replies = self._run_steps(end, *(self._closing(keys, now_ms, token) if release else ()))
        return bool(replies[0])

    def close_run(self, session_key: str, run_id: str, now_ms: int, *, token: int | None = None) -> None:
        """Free an ended run's lane (if it still holds it) and move it to the ended index."""
        with store_errors():
            self._run_steps(*self._closing(RunKeys(self.prefix, session_key, run_id), now_ms, token))

    def _closing(self, keys: RunKeys, now_ms: int, token: int | None) -> tuple[ScriptStep, ScriptStep]:
        expected = "" if token is None else token
        release = ScriptStep(self._release, [self.session(keys.session_key).lane], [keys.run_id, expected])
        return release, self._indexes.leaving(keys, now_ms, ended=True)

    # -- writes by the watchdog and the operator ------------------------------------------------

    def try_sweep_lock(self, token: str, ttl_ms: int) -> bool:
        """Take the sweep lock (SET NX PX); False while another sweep holds it."""
        with store_errors():
            return bool(self.client.set(sweep_lock_key(self.prefix), token, nx=True, px=ttl_ms))

    def release_sweep_lock(self, token: str) -> bool:
        """Release the sweep lock if ``token`` still owns it."""
        with store_errors():
            return bool(self._unlock(keys=[sweep_lock_key(self.prefix)], args=[token]))

    def set_class(self, pairs_classes: Iterable[tuple[str, str, str]]) -> None:
        """Store the watchdog's latest class of each (session, run)."""
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for session_key, run_id, klass in pairs_classes:
                pipe.hset(RunKeys(self.prefix, session_key, run_id).run, RunField.CLASS, klass)
            pipe.execute()

    def note_activity(self, scores: dict[tuple[str, str], int]) -> None:
        """Move runs' progress scores forward to activity found in their calls (never back)."""
        if not scores:
            return
        buckets: dict[int, dict[str, int]] = {}
        for (session_key, run_id), ms in scores.items():
            member = run_member(session_key, run_id)
            buckets.setdefault(member_bucket(member), {})[member] = ms
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for bucket, mapping in buckets.items():
                pipe.zadd(index_keys(self.prefix, bucket).by_progress, mapping, xx=True, gt=True)
            pipe.execute()

    def release_lane(self, session_key: str, run_id: str, token: int | None = None) -> bool:
        """Free the lane if ``run_id`` (with ``token``, if given) holds it."""
        expected = "" if token is None else str(token)
        with store_errors():
            return bool(self._release(keys=[self.session(session_key).lane], args=[run_id, expected]))

    def drop_stale(self, session_key: str, run_id: str, now_ms: int) -> None:
        """Remove an index member whose run record expired or ended (the indexes are hints).

        The run's done list gets its TTL too: a finish on a running run sets none, and a run
        whose record expired while running never reached ``session_end.lua``.
        """
        with store_errors():
            self.client.expire(self.run_keys(session_key, run_id).done, self._done_ttl_s)
            self._unindex(session_key, run_id, now_ms, ended=False)

    def _supersede(
        self,
        session_key: str,
        run_id: str,
        token: int,
        now_ms: int,
        answer_superseded: Callable[[RunKeys], object] | None,
    ) -> None:
        keys = RunKeys(self.prefix, session_key, run_id)
        with store_errors():
            ended = bool(
                self._end(
                    keys=[keys.run, keys.done],
                    args=[RunStatus.ABORTED.value, now_ms, "superseded", str(token), self._done_ttl_s],
                )
            )
            self._unindex(session_key, run_id, now_ms, ended=ended)
        if ended and answer_superseded is not None:
            answer_superseded(keys)

    def _unindex(self, session_key: str, run_id: str, now_ms: int, *, ended: bool) -> None:
        self._run_steps(self._indexes.leaving(self.run_keys(session_key, run_id), now_ms, ended=ended))


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
