"""The watchdog's edge: read what is due, let :mod:`workers.core.run_health` decide, then act.

One sweep, under a sweep lock so two beats never act twice:

1. overdue and lost calls get their synthetic results (:func:`workers.watchdog.due_calls.sweep_due_calls`);
2. runs past their deadline end ``timed_out``: unanswered calls answered
   ``deadline_exceeded``, queued tasks revoked, lane freed;
3. runs with no indexed progress for ``stalled_after_s`` are re-read and classified from
   their record's summary (latest activity of any call, unanswered and claimed call
   counts: see :mod:`workers.store.keys`); entering ``stalled`` or ``stuck`` raises an
   alert, and with ``auto_recover`` a stuck run is ended ``aborted`` (calls answered
   ``cancelled``, queued tasks revoked, lane freed). An alert or a recovery is confirmed
   first from the run's calls (state, lease), so a drifted summary cannot end live work.
   Runs found active move forward in the progress index, so the next sweep does not read
   them again before they could be stalled;
4. index members of runs that ended or expired are dropped. Lanes clean themselves: each
   expires at its run's deadline plus a margin.

Cost: O(due), never O(sessions) (see ``bench/watchdog.py``): calls are found by deadline
and by lease expiry, runs by deadline and by progress, each read once. The indexes are split
into buckets (:mod:`workers.store.keys`) and read bucket by bucket, every bucket in one round
trip. Due calls are probed with one pipelined read of their records and leases. On a single
Redis node a script (:mod:`workers.store.sweep_scripts`) settles steady runs inside Redis, a
bounded page of one bucket per script call, returning only what needs an alert, an action
or a drop; on a cluster the same reads are pipelined and every run is judged here.
``SweepReport.phases_ms`` times ``calls``, ``runs`` (script, or index reads), ``judge``
(reading and judging returned runs) and ``apply``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from workers.answering.service import Answers
from workers.core.models import SyntheticReason
from workers.core.run_health import (
    CallActivity,
    RunStatus,
    RunVerdict,
    RunView,
    SessionClass,
    WatchdogAction,
    WatchdogPolicy,
    judge,
    judge_all,
    needs_confirmation,
)
from workers.errors import StoreError
from workers.settings import Settings
from workers.store.sessions import Lane, RunInfo, SessionStore
from workers.store.sweep_scripts import SweepScripts, server_side_ok
from workers.watchdog.alerts import AlertSink
from workers.watchdog.due_calls import sweep_due_calls

__all__ = ["SweepReport", "Watchdog", "clean_stale_lanes", "end_and_answer", "run_view", "stale_lanes"]

log = logging.getLogger(__name__)

Revoke = Callable[[list[str]], object]


@dataclass
class SweepReport:
    """What one sweep did."""

    locked_out: bool = False
    calls_answered: int = 0
    timed_out: int = 0
    recovered: int = 0
    alerts: int = 0
    dropped: int = 0
    classes: dict[str, int] = field(default_factory=dict)
    phases_ms: dict[str, float] = field(default_factory=dict)


def run_view(info: RunInfo, calls: Iterable[CallActivity] | None = None) -> RunView:
    """The watchdog's view of a stored run: its summary, or its ``calls`` when they were read."""
    return RunView(
        session_key=info.session_key,
        run_id=info.run_id,
        status=info.status,
        started_ms=info.started_ms,
        deadline_ms=info.deadline_ms,
        progress_ms=info.progress_ms,
        previous_class=info.klass,
        open_calls=info.open_calls,
        claimed_calls=info.claimed_calls,
        calls=None if calls is None else tuple(calls),
    )


def end_and_answer(
    sessions: SessionStore,
    answers: Answers,
    session_key: str,
    run_id: str,
    *,
    status: RunStatus,
    reason: SyntheticReason,
    detail: str,
    now_ms: int,
    revoke: Revoke | None,
) -> int:
    """End a run, answer its unanswered calls with ``reason``, revoke their tasks; returns calls answered.

    The run ends first, so its gateway's next ``touch_progress`` already fails; the lane is
    freed only once every call is answered. Revocation never terminates a running tool (its
    result, if any, is kept as late).
    """
    sessions.end_run(session_key, run_id, status, now_ms, reason=reason.value, release=False)
    keys = sessions.run_keys(session_key, run_id)
    answered = answers.end_run(keys, reason, now_ms=now_ms, detail=detail).on(sessions.ledger)
    sessions.close_run(session_key, run_id, now_ms)
    task_ids = [task_id for _, task_id in answered if task_id]
    if revoke is not None and task_ids:
        try:
            revoke(task_ids)
        except Exception as exc:  # noqa: BLE001 - revocation only saves a worker slot
            log.warning("revoking %d task(s) of %s/%s failed: %s", len(task_ids), session_key, run_id, exc)
    return len(answered)


class Watchdog:
    """Sweeps the store; built once per process from settings."""

    def __init__(
        self,
        sessions: SessionStore,
        settings: Settings,
        *,
        writer: str,
        alerts: AlertSink,
        revoke: Revoke | None = None,
        limit: int = 10_000,
        server_side: bool | None = None,
    ) -> None:
        """Build a watchdog; ``server_side`` (default: on a single Redis node) sweeps with scripts."""
        self.sessions = sessions
        self.settings = settings
        self.writer = writer
        self.answers = Answers(writer=writer, fallbacks=settings.tools.failure_rules().fallbacks)
        self.alerts = alerts
        self.revoke = revoke
        self.limit = limit
        watchdog = settings.watchdog
        self.policy = WatchdogPolicy(int(watchdog.stalled_after_s * 1000), watchdog.auto_recover)
        self.lock_ttl_ms = int(watchdog.sweep_lock_ttl_s * 1000)
        if server_side is None:
            server_side = server_side_ok(sessions.ledger)
        self.scripts = SweepScripts(sessions.ledger) if server_side else None
        self._unreleased: set[str] = set()  # tokens of locks a store failure kept us from releasing

    def sweep(self, now_ms: int) -> SweepReport:
        """One sweep; does nothing (``locked_out``) while another sweep holds the lock."""
        self._release_kept_locks()
        token = uuid.uuid4().hex
        if not self.sessions.try_sweep_lock(token, self.lock_ttl_ms):
            return SweepReport(locked_out=True)
        try:
            return self._sweep(now_ms)
        finally:
            self._release_lock(token)

    def _release_lock(self, token: str) -> None:
        try:
            self.sessions.release_sweep_lock(token)
        except StoreError:
            # A restarted Redis reloads the lock: left there, it would lock every sweep out
            # for its whole TTL, so the next sweep releases it first.
            self._unreleased.add(token)
            raise

    def _release_kept_locks(self) -> None:
        for token in list(self._unreleased):
            self.sessions.release_sweep_lock(token)
            self._unreleased.discard(token)

    def _sweep(self, now_ms: int) -> SweepReport:
        report = SweepReport()
        clock = _Phases(report.phases_ms)
        report.calls_answered = sweep_due_calls(
            self.sessions.ledger,
            now_ms=now_ms,
            settings=self.settings,
            writer=self.writer,
            limit=self.limit,
        )
        clock.lap("calls")
        if self.scripts is not None:
            found = self.scripts.runs(
                now_ms=now_ms,
                stalled_after_ms=self.policy.stalled_after_ms,
                auto_recover=self.policy.auto_recover,
                limit=self.limit,
            )
            report.classes.update(found.settled)
            pairs = found.rest
        else:
            due = self.sessions.past_deadline(now_ms, self.limit)
            quiet = self.sessions.quiet_since(now_ms - self.policy.stalled_after_ms, self.limit)
            pairs = list(dict.fromkeys((s, r) for s, r, _ in [*due, *quiet]))
        clock.lap("runs")
        verdicts = self._judge(pairs, now_ms)
        clock.lap("judge")
        seen = {(v.session_key, v.run_id) for v in verdicts}
        for session_key, run_id in pairs:
            if (session_key, run_id) not in seen:  # run record expired: the member is a stale hint
                self.sessions.drop_stale(session_key, run_id, now_ms)
                report.dropped += 1
        self._apply(verdicts, now_ms, report)
        clock.lap("apply")
        return report

    def _judge(self, pairs: Sequence[tuple[str, str]], now_ms: int) -> list[RunVerdict]:
        """Judge runs from their summaries; confirm alerts and recoveries from their calls."""
        views = [run_view(info) for info in self.sessions.runs(pairs)]
        verdicts = judge_all(views, now_ms=now_ms, policy=self.policy)
        doubtful = [n for n, v in enumerate(verdicts) if needs_confirmation(v)]
        activity = self.sessions.activity([(views[n].session_key, views[n].run_id) for n in doubtful])
        for n in doubtful:
            calls = activity[(views[n].session_key, views[n].run_id)]
            verdicts[n] = judge(views[n].with_calls(calls), now_ms=now_ms, policy=self.policy)
        return verdicts

    def _apply(self, verdicts: list[RunVerdict], now_ms: int, report: SweepReport) -> None:
        classes: list[tuple[str, str, str]] = []
        active: dict[tuple[str, str], int] = {}
        for v in verdicts:
            if v.action is WatchdogAction.DROP:
                self.sessions.drop_stale(v.session_key, v.run_id, now_ms)
                report.dropped += 1
                continue
            assert v.klass is not None
            report.classes[v.klass.value] = report.classes.get(v.klass.value, 0) + 1
            classes.append((v.session_key, v.run_id, v.klass.value))
            if v.klass in (SessionClass.ACTIVE, SessionClass.LONG_RUNNING):
                active[(v.session_key, v.run_id)] = v.last_activity_ms
            if v.alert:
                self._alert(v)
                report.alerts += 1
            if v.action is WatchdogAction.TIME_OUT:
                self._end(v, RunStatus.TIMED_OUT, SyntheticReason.DEADLINE_EXCEEDED, now_ms, " (run timeout)")
                report.timed_out += 1
            elif v.action is WatchdogAction.RECOVER:
                self._end(
                    v, RunStatus.ABORTED, SyntheticReason.CANCELLED, now_ms, " by the stuck-session watchdog"
                )
                report.recovered += 1
        self.sessions.set_class(classes)
        self.sessions.note_activity(active)

    def _end(
        self, v: RunVerdict, status: RunStatus, reason: SyntheticReason, now_ms: int, detail: str
    ) -> None:
        answered = end_and_answer(
            self.sessions,
            self.answers,
            v.session_key,
            v.run_id,
            status=status,
            reason=reason,
            detail=detail,
            now_ms=now_ms,
            revoke=self.revoke,
        )
        log.warning(
            "watchdog ended run %s/%s as %s (%s); %d call(s) answered",
            v.session_key,
            v.run_id,
            status.value,
            v.klass.value if v.klass else "-",
            answered,
        )

    def _alert(self, v: RunVerdict) -> None:
        assert v.klass is not None
        self.alerts.emit(
            {
                "kind": f"session.{v.klass.value}",
                "session_key": v.session_key,
                "run_id": v.run_id,
                "idle_ms": v.idle_ms,
                "last_activity_ms": v.last_activity_ms,
                "auto_recover": self.policy.auto_recover,
            }
        )


class _Phases:
    """Wall time of a sweep's phases, for the report (ms)."""

    def __init__(self, into: dict[str, float]) -> None:
        self.into = into
        self.mark = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.into[name] = (now - self.mark) * 1000
        self.mark = now


def stale_lanes(sessions: SessionStore, now_ms: int) -> list[tuple[Lane, str]]:
    """Lanes nobody should hold, with why: run record gone, run ended, or lease past (SCAN)."""
    lanes = sessions.lanes()
    infos = {(i.session_key, i.run_id): i for i in sessions.runs([(x.session_key, x.run_id) for x in lanes])}
    stale: list[tuple[Lane, str]] = []
    for lane in lanes:
        info = infos.get((lane.session_key, lane.run_id))
        if info is None:
            stale.append((lane, "run record gone"))
        elif info.status != RunStatus.RUNNING.value:
            stale.append((lane, f"run {info.status}"))
        elif lane.lease_until_ms and lane.lease_until_ms <= now_ms:
            stale.append((lane, "lease expired"))
    return stale


def clean_stale_lanes(sessions: SessionStore, now_ms: int) -> int:
    """Release every stale lane (token-checked, so a lane re-taken meanwhile stays); returns how many."""
    return sum(
        sessions.release_lane(lane.session_key, lane.run_id, lane.token)
        for lane, _ in stale_lanes(sessions, now_ms)
    )
