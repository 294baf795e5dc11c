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
  timed_out``, token and the watchdog's last class, in the run's hash (next to ``ensure_run``).
* **Indexes.** Running runs are members of two global sorted sets, by deadline and by last
  progress, so a sweep reads only the runs that are due (O(due), not O(sessions)). They are
  hints: every decision re-reads the run record. Members are removed when a run ends.

Multi-slot updates (lane, run record, indexes) are ordered single-slot atomic steps; see the
key schema for why. Times come in as arguments; nothing here reads the clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from workers.core.models import SyntheticReason
from workers.core.reaper import answer_open_call
from workers.core.run_health import CallActivity, RunStatus
from workers.store.keys import (
    RunKeys,
    SessionKeys,
    lane_pattern,
    parse_lane_key,
    parse_run_member,
    run_index_keys,
    run_member,
    sweep_lock_key,
)
from workers.store.ledger import Ledger, parse_int, store_errors
from workers.store.lua import load_script

__all__ = ["Lane", "RunInfo", "SessionStore"]

RECENT_CALLS = 20
LANE_LEASE_MARGIN_MS = 60_000


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
    status: str
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


def _text(raw: dict[Any, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in raw.items()}


def _scored(member: Any, score: Any) -> tuple[str, str, int]:
    session_key, run_id = parse_run_member(str(member))
    return session_key, run_id, int(score)


def _run_info(session_key: str, run_id: str, raw: dict[str, str]) -> RunInfo:
    fields = (
        "started_ms", "deadline_ms", "progress_ms", "token", "ended_ms", "open_n", "claimed_n",
        "agent_beat_ms", "stream_idle_n",
    )  # fmt: skip
    num = {k: parse_int(raw.get(k)) for k in fields}
    return RunInfo(
        session_key, run_id, raw.get("agent_id", ""), raw.get("status", ""), num["started_ms"],
        num["deadline_ms"], num["progress_ms"] or num["started_ms"], num["token"], raw.get("class", ""),
        num["ended_ms"], raw.get("end_reason", ""), max(0, num["open_n"]), max(0, num["claimed_n"]),
        num["agent_beat_ms"], raw.get("agent_beat_what", ""), num["stream_idle_n"],
    )  # fmt: skip


class SessionStore:
    """Redis access for lanes, run records and run indexes; raises ``StoreError`` on Redis failure."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.client = ledger.client
        self.prefix = ledger.prefix
        self.index = run_index_keys(ledger.prefix)
        self._acquire = load_script(self.client, "session_acquire.lua")
        self._release = load_script(self.client, "session_release.lua")
        self._start = load_script(self.client, "session_start.lua")
        self._touch = load_script(self.client, "session_touch.lua")
        self._end = load_script(self.client, "session_end.lua")
        self._unlock = load_script(self.client, "session_unlock.lua")

    def session(self, session_key: str) -> SessionKeys:
        """The key builder of one session."""
        return SessionKeys(self.prefix, session_key)

    # -- the gateway's calls ------------------------------------------------------------------

    def begin_run(
        self, session_key: str, run_id: str, agent_id: str, now_ms: int, deadline_ms: int, *, writer: str
    ) -> int:
        """Take the session's lane for ``run_id``; returns its fencing token, 0 if the run already ended.

        Idempotent for the run holding the lane. A run holding the lane before is superseded:
        marked ``aborted`` and its unanswered calls answered ``cancelled`` (by ``writer``).
        """
        run_keys = RunKeys(self.prefix, session_key, run_id)
        sess = self.session(session_key)
        with store_errors():
            status = self.client.hget(run_keys.run, "status")
            if status and status != RunStatus.RUNNING.value:
                return 0
            lease_until = max(deadline_ms, now_ms) + LANE_LEASE_MARGIN_MS
            token, previous, prev_token = self._acquire(
                keys=[sess.lane, sess.fence],
                args=[run_id, agent_id, now_ms, lease_until, self.ledger.ttl_s],
            )
            stored_deadline = self._start(
                keys=[run_keys.run], args=[token, now_ms, deadline_ms, agent_id, self.ledger.ttl_s]
            )
            member = run_member(session_key, run_id)
            pipe = self.client.pipeline(transaction=True)
            pipe.zadd(self.index.by_deadline, {member: int(stored_deadline or deadline_ms)})
            pipe.zadd(self.index.by_progress, {member: now_ms}, gt=True)
            # Indexes expire too, refreshed on every write: idle for a whole ledger TTL,
            # every run they point to has expired as well.
            pipe.expire(self.index.by_deadline, self.ledger.ttl_s)
            pipe.expire(self.index.by_progress, self.ledger.ttl_s)
            pipe.execute()
        if previous:
            self._supersede(session_key, str(previous), int(prev_token), now_ms, writer)
        return int(token)

    def touch_progress(self, session_key: str, run_id: str, now_ms: int) -> bool:
        """Record progress of a run; False once it is no longer running (superseded or ended)."""
        keys = RunKeys(self.prefix, session_key, run_id)
        with store_errors():
            if not self._touch(keys=[keys.run], args=[now_ms]):
                return False
        self.index_progress(session_key, run_id, now_ms)
        return True

    def index_progress(self, session_key: str, run_id: str, now_ms: int) -> None:
        """Move a run forward in the progress index (never back; never adds a member)."""
        with store_errors():
            member = run_member(session_key, run_id)
            self.client.zadd(self.index.by_progress, {member: now_ms}, xx=True, gt=True)

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
        with store_errors():
            ended = bool(self._end(keys=[keys.run], args=[status.value, now_ms, reason, expected]))
        if release:
            self.close_run(session_key, run_id, now_ms, token=token)
        return ended

    def close_run(self, session_key: str, run_id: str, now_ms: int, *, token: int | None = None) -> None:
        """Free an ended run's lane (if it still holds it) and move it to the ended index."""
        with store_errors():
            self._release(
                keys=[self.session(session_key).lane], args=[run_id, "" if token is None else token]
            )
            self._unindex(session_key, run_id, now_ms, ended=True)

    def holds_lane(self, session_key: str, run_id: str, token: int) -> bool:
        """Whether ``run_id`` still holds its session's lane with ``token`` (the fencing check)."""
        lane = self.lane(session_key)
        return lane is not None and lane.run_id == run_id and lane.token == token

    # -- reads ------------------------------------------------------------------------------------

    def lane(self, session_key: str) -> Lane | None:
        """The lane of a session, or None when free."""
        with store_errors():
            raw = self.client.hgetall(self.session(session_key).lane)
        return _lane(session_key, _text(raw)) if raw else None

    def run(self, session_key: str, run_id: str) -> RunInfo | None:
        """One run record, or None when it does not exist (or expired)."""
        found = self.runs([(session_key, run_id)])
        return found[0] if found else None

    def runs(self, pairs: Sequence[tuple[str, str]]) -> list[RunInfo]:
        """Run records of (session, run) pairs, in one round trip; missing ones are skipped."""
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for session_key, run_id in pairs:
                pipe.hgetall(RunKeys(self.prefix, session_key, run_id).run)
            rows = pipe.execute() if pairs else []
        return [_run_info(s, r, raw) for (s, r), raw in zip(pairs, rows, strict=True) if raw]

    def _members(self, key: str, low: float, high: float, limit: int) -> list[tuple[str, str, int]]:
        with store_errors():
            rows: Any = self.client.zrangebyscore(key, low, high, start=0, num=limit, withscores=True)
        return [_scored(m, score) for m, score in rows]

    def past_deadline(self, now_ms: int, limit: int) -> list[tuple[str, str, int]]:
        """Running runs whose deadline has passed: (session, run, deadline ms)."""
        return self._members(self.index.by_deadline, float("-inf"), now_ms, limit)

    def quiet_since(self, before_ms: int, limit: int) -> list[tuple[str, str, int]]:
        """Running runs with no indexed progress after ``before_ms``: (session, run, progress ms)."""
        return self._members(self.index.by_progress, float("-inf"), before_ms, limit)

    def running(self, limit: int) -> list[tuple[str, str, int]]:
        """Indexed running runs, oldest progress first: (session, run, progress ms)."""
        return self._members(self.index.by_progress, float("-inf"), float("inf"), limit)

    def ended(self, limit: int) -> list[tuple[str, str, int]]:
        """Recently ended runs, newest first: (session, run, end ms)."""
        with store_errors():
            rows: Any = self.client.zrevrange(self.index.ended, 0, limit - 1, withscores=True)
        return [_scored(m, score) for m, score in rows]

    def find_session(self, session_key: str, limit: int = 100_000) -> RunInfo | None:
        """The session's current run (lane holder), else its latest run found in the indexes."""
        lane = self.lane(session_key)
        if lane is not None and (info := self.run(session_key, lane.run_id)) is not None:
            return info
        candidates = [(s, r) for s, r, _ in self.running(limit) + self.ended(limit) if s == session_key]
        infos = self.runs(candidates)
        return max(infos, key=lambda info: info.started_ms, default=None)

    def activity(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], list[CallActivity]]:
        """Recent and open calls of each run, with their real activity times (two round trips)."""
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for session_key, run_id in pairs:
                keys = RunKeys(self.prefix, session_key, run_id)
                pipe.zrevrange(keys.calls, 0, RECENT_CALLS - 1)
                pipe.zrange(keys.open, 0, RECENT_CALLS - 1)
            raw = pipe.execute() if pairs else []
            wanted: list[tuple[tuple[str, str], str]] = []
            for index, pair in enumerate(pairs):
                ids = dict.fromkeys([*raw[2 * index], *raw[2 * index + 1]])
                wanted.extend((pair, str(call_id)) for call_id in ids)
            pipe = self.client.pipeline(transaction=False)
            for (session_key, run_id), call_id in wanted:
                keys = RunKeys(self.prefix, session_key, run_id)
                pipe.hmget(keys.call(call_id), _ACTIVITY_FIELDS)
                pipe.exists(keys.lease(call_id))
            rows = pipe.execute() if wanted else []
        out: dict[tuple[str, str], list[CallActivity]] = {pair: [] for pair in pairs}
        for n, (pair, call_id) in enumerate(wanted):
            fields, lease = rows[2 * n], rows[2 * n + 1]
            if fields[0] is not None:
                out[pair].append(_activity(call_id, fields, bool(lease)))
        return out

    def lanes(self, count: int = 1000) -> list[Lane]:
        """Every lane lock (SCAN: for the operator's ``locks`` command, not for sweeps)."""
        found: list[Lane] = []
        with store_errors():
            for key in self.client.scan_iter(match=lane_pattern(self.prefix), count=count):
                raw = self.client.hgetall(key)
                if raw:
                    found.append(_lane(parse_lane_key(self.prefix, str(key)), _text(raw)))
        return found

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
                pipe.hset(RunKeys(self.prefix, session_key, run_id).run, "class", klass)
            pipe.execute()

    def note_activity(self, scores: dict[tuple[str, str], int]) -> None:
        """Move runs' progress scores forward to activity found in their calls (never back)."""
        if not scores:
            return
        mapping = {run_member(s, r): ms for (s, r), ms in scores.items()}
        with store_errors():
            self.client.zadd(self.index.by_progress, mapping, xx=True, gt=True)

    def release_lane(self, session_key: str, run_id: str, token: int | None = None) -> bool:
        """Free the lane if ``run_id`` (with ``token``, if given) holds it."""
        expected = "" if token is None else str(token)
        with store_errors():
            return bool(self._release(keys=[self.session(session_key).lane], args=[run_id, expected]))

    def drop_stale(self, session_key: str, run_id: str, now_ms: int) -> None:
        """Remove an index member whose run record expired or ended (the indexes are hints)."""
        with store_errors():
            self._unindex(session_key, run_id, now_ms, ended=False)

    def answer_open_calls(
        self, session_key: str, run_id: str, reason: SyntheticReason, *, now_ms: int, writer: str, detail: str
    ) -> list[tuple[str, str]]:
        """Answer every unanswered call of a run with ``reason``; returns (call id, task id) answered."""
        keys = RunKeys(self.prefix, session_key, run_id)
        with store_errors():
            open_ids = [str(c) for c in self.client.zrange(keys.open, 0, -1)]
        answered: list[tuple[str, str]] = []
        for call in self.ledger.open_calls(keys, open_ids):
            result = answer_open_call(call, reason, now_ms=now_ms, detail=detail)
            if self.ledger.finish(keys, result, now_ms=now_ms, writer=writer):
                record = self.ledger.record(keys, call.call_id)
                answered.append((call.call_id, record.fields.get("task_id", "") if record else ""))
        return answered

    def _supersede(self, session_key: str, run_id: str, token: int, now_ms: int, writer: str) -> None:
        keys = RunKeys(self.prefix, session_key, run_id)
        with store_errors():
            ended = bool(
                self._end(keys=[keys.run], args=[RunStatus.ABORTED.value, now_ms, "superseded", str(token)])
            )
            self._unindex(session_key, run_id, now_ms, ended=ended)
        if ended:
            detail = " because a newer run of this session took over"
            self.answer_open_calls(
                session_key, run_id, SyntheticReason.CANCELLED, now_ms=now_ms, writer=writer, detail=detail
            )

    def _unindex(self, session_key: str, run_id: str, now_ms: int, *, ended: bool) -> None:
        member = run_member(session_key, run_id)
        pipe = self.client.pipeline(transaction=True)
        pipe.zrem(self.index.by_deadline, member)
        pipe.zrem(self.index.by_progress, member)
        if ended:
            pipe.zadd(self.index.ended, {member: now_ms})
        pipe.zremrangebyscore(self.index.ended, float("-inf"), now_ms - self.ledger.ttl_s * 1000)
        pipe.expire(self.index.ended, self.ledger.ttl_s)
        pipe.execute()


_ACTIVITY_FIELDS = ["state", "tool", "submitted_ms", "started_ms", "hb_ms", "finished_ms", "dispatched"]


def _activity(call_id: str, fields: list[Any], lease_alive: bool) -> CallActivity:
    state, tool, submitted, started, hb, finished, dispatched = fields
    return CallActivity(
        call_id, str(tool or ""), str(state or "pending"), parse_int(submitted), parse_int(started),
        parse_int(hb), parse_int(finished), lease_alive, dispatched == "1",
    )  # fmt: skip


def _lane(session_key: str, raw: dict[str, str]) -> Lane:
    return Lane(
        session_key=session_key,
        run_id=raw.get("run_id", ""),
        token=parse_int(raw.get("token")),
        agent_id=raw.get("agent_id", ""),
        since_ms=parse_int(raw.get("since_ms")),
        lease_until_ms=parse_int(raw.get("lease_until_ms")),
    )
