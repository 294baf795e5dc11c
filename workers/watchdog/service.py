"""The watchdog process's sweep and housekeeping, as its two control tasks run them.

One service per process, built on the first task: its :class:`Watchdog`, and the task events
that close in Flower the tasks of the calls it answers (their worker is gone or late). Each
completed sweep is recorded (``P:{runs}:watchdog``), and a gap of more than two intervals
since the previous one raises a ``watchdog_late`` alert.
"""

from __future__ import annotations

import logging
import threading
from functools import cached_property
from typing import Any

from celery import Celery

from workers import tracing
from workers.celery_edge.task_events import TaskEvents
from workers.core.run_health import watchdog_late
from workers.errors import StoreError
from workers.runtime import Runtime, now_ms, worker_id
from workers.store.openclaw_calls import OpenClawCalls
from workers.store.sessions import SessionStore
from workers.store.watchdog_liveness import WatchdogLiveness
from workers.watchdog.alerts import AlertSink
from workers.watchdog.openclaw_sweep import OpenClawSweep
from workers.watchdog.sweep import Watchdog, clean_stale_lanes

__all__ = ["WatchdogService"]

log = logging.getLogger(__name__)


class WatchdogService:
    """The sweep and the lane housekeeping of one watchdog process (``app``: its control app)."""

    def __init__(self, app: Celery, rt: Runtime) -> None:
        flush_ms = rt.settings.broker.task_events_flush_ms
        self.events = TaskEvents(app, rt.ledger, role="watchdog", flush_ms=flush_ms).attach()
        tracing.watch_answers(rt.ledger, "watchdog")
        self._app = app
        self._ledger = rt.ledger
        self.watchdog = Watchdog(
            SessionStore(rt.ledger),
            rt.settings,
            writer=f"{worker_id()}/watchdog",
            alerts=AlertSink(rt.settings.watchdog.webhook_url, publish=self._publish_alert),
            revoke=self._revoke,
        )
        openclaw_alerts = AlertSink(
            rt.settings.alerts.webhook_url or rt.settings.watchdog.webhook_url, publish=self._publish_alert
        )
        self.openclaw = OpenClawSweep(
            OpenClawCalls(rt.ledger.client, prefix=rt.ledger.prefix, ttl_s=rt.ledger.ttl_s),
            rt.settings,
            alert=openclaw_alerts.emit,
        )
        self._guard: threading.Thread | None = None

    def _revoke(self, task_ids: list[str]) -> None:
        # Never terminate: a tool already running finishes under its own limits.
        self._app.control.revoke(task_ids, terminate=False)

    def _publish_alert(self, event: dict[str, Any]) -> None:
        fields = {k: v for k, v in event.items() if k != "kind"}
        tracing.alert(event)
        self._ledger.publish_event(str(event.get("kind", "alert")), **fields)

    @cached_property
    def _liveness(self) -> WatchdogLiveness:
        return WatchdogLiveness(self._ledger)

    def sweep(self) -> int:
        """One watchdog sweep; returns how many calls it answered (0 when another sweep held the lock)."""
        with tracing.span("unstuck.watchdog.sweep") as note:
            started_ms = now_ms()
            report = self.watchdog.sweep(started_ms)
            note("unstuck.sweep.calls_answered", report.calls_answered)
        if report.locked_out:
            log.info("watchdog sweep skipped: another sweep holds the lock")
            return 0
        self._guard_openclaw(started_ms)
        if report.calls_answered or report.timed_out or report.recovered or report.alerts:
            log.warning("watchdog sweep: %s", report)
            self.events.flush(timeout_s=2.0)
        self._note_completed()
        return report.calls_answered

    def _guard_openclaw(self, started_ms: int) -> None:
        # OpenClaw's calls are a guard beside the sweep, never in its way: the guard kills process
        # trees and calls OpenClaw's gateway through its CLI (seconds each, up to 20 s when the
        # gateway hangs), so it runs on a thread of its own, one run at a time, and a sweep that
        # finds the last run still busy leaves it be. The sweep never waits on what it watches.
        if self._guard is not None and self._guard.is_alive():
            return
        self._guard = threading.Thread(
            target=self._run_openclaw_guard, args=(started_ms,), name="openclaw-guard", daemon=True
        )
        self._guard.start()

    def _run_openclaw_guard(self, started_ms: int) -> None:
        try:
            guarded = self.openclaw.sweep(started_ms)  # the sweep's own clock reading: one per sweep
        except StoreError as exc:
            log.warning("watchdog openclaw sweep failed: %s", exc)
            return
        if guarded.killed or guarded.overdue or guarded.stuck:
            log.warning("watchdog openclaw sweep: %s", guarded)

    def _note_completed(self) -> None:
        """Record the sweep; alert when the gap since the previous one shows the watchdog fell behind."""
        done_ms = now_ms()
        gap_ms = self._liveness.sweep_completed(done_ms)
        interval_ms = int(self.watchdog.settings.watchdog.interval_s * 1000)
        if gap_ms is not None and watchdog_late(gap_ms, interval_ms=interval_ms):
            self.watchdog.alerts.emit({"kind": "watchdog_late", "gap_ms": gap_ms, "interval_ms": interval_ms})

    def housekeeping(self) -> int:
        """Release lanes whose run ended, expired or outlived its lease; returns how many."""
        return clean_stale_lanes(self.watchdog.sessions, now_ms())
