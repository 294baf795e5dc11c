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

The reads (lanes, run records, indexes, the activity of a run's calls) are in
:mod:`workers.store.session_reads`; the fields of each record in :mod:`workers.store.records`.
Multi-slot updates (lane, run record, indexes) are ordered single-slot atomic steps; see the
key schema for why. Times come in as arguments; nothing here reads the clock.
"""

from __future__ import annotations

from collections.abc import Iterable

from workers.core.models import SyntheticReason
from workers.core.run_health import RunStatus
from workers.core.waiting import answer_open_call
from workers.store.connection import store_errors
from workers.store.keys import RunKeys, index_keys, member_bucket, run_member, sweep_lock_key
from workers.store.ledger import Ledger
from workers.store.lua import load_script
from workers.store.records import CallField, RunField
from workers.store.session_reads import Lane, RunInfo, SessionReads

__all__ = ["Lane", "RunInfo", "SessionStore"]

LANE_LEASE_MARGIN_MS = 60_000
_OPEN_CALLS_PAGE = 500  # calls per ledger_open.lua script when answering a run's open calls


class SessionStore(SessionReads):
    """Redis access for lanes, run records and run indexes; raises ``StoreError`` on Redis failure."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.client = ledger.client
        self.prefix = ledger.prefix
        self._acquire = load_script(self.client, "session_acquire.lua")
        self._release = load_script(self.client, "session_release.lua")
        self._start = load_script(self.client, "session_start.lua")
        self._touch = load_script(self.client, "session_touch.lua")
        self._end = load_script(self.client, "session_end.lua")
        self._unlock = load_script(self.client, "session_unlock.lua")

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
            status = self.client.hget(run_keys.run, RunField.STATUS)
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
            member, index = run_member(session_key, run_id), run_keys.index
            pipe = self.client.pipeline(transaction=True)
            pipe.zadd(index.by_deadline, {member: int(stored_deadline or deadline_ms)})
            pipe.zadd(index.by_progress, {member: now_ms}, gt=True)
            # Indexes expire too, refreshed on every write: idle for a whole ledger TTL,
            # every run they point to has expired as well.
            pipe.expire(index.by_deadline, self.ledger.ttl_s)
            pipe.expire(index.by_progress, self.ledger.ttl_s)
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
        """Remove an index member whose run record expired or ended (the indexes are hints)."""
        with store_errors():
            self._unindex(session_key, run_id, now_ms, ended=False)

    def answer_open_calls(
        self, session_key: str, run_id: str, reason: SyntheticReason, *, now_ms: int, writer: str, detail: str
    ) -> list[tuple[str, str]]:
        """Answer every unanswered call of a run with ``reason``; returns (call id, task id) answered."""
        keys = RunKeys(self.prefix, session_key, run_id)
        call_ids = self.ledger.run_call_ids(keys)
        open_calls = [  # in pages: one script over thousands of calls would block Redis too long
            call
            for start in range(0, len(call_ids), _OPEN_CALLS_PAGE)
            for call in self.ledger.open_calls(keys, call_ids[start : start + _OPEN_CALLS_PAGE])
        ]
        answered: list[tuple[str, str]] = []
        for call in open_calls:
            result = answer_open_call(call, reason, now_ms=now_ms, detail=detail)
            if self.ledger.finish(keys, result, now_ms=now_ms, writer=writer):
                record = self.ledger.record(keys, call.call_id)
                answered.append((call.call_id, record.row.text(CallField.TASK_ID) if record else ""))
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
        member, index = run_member(session_key, run_id), self.run_keys(session_key, run_id).index
        pipe = self.client.pipeline(transaction=True)
        pipe.zrem(index.by_deadline, member)
        pipe.zrem(index.by_progress, member)
        if ended:
            pipe.zadd(index.ended, {member: now_ms})
        pipe.zremrangebyscore(index.ended, float("-inf"), now_ms - self.ledger.ttl_s * 1000)
        pipe.expire(index.ended, self.ledger.ttl_s)
        pipe.execute()
