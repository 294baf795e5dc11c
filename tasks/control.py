"""The watchdog's tasks: the sweep (every ``watchdog.interval_s``) and housekeeping.

Registered only on the control app, consumed only from ``broker.control_queue`` by
``unstuck watchdog``: no tool worker runs them, so nothing the watchdog watches can starve it.
Each completed sweep is recorded (``P:{runs}:watchdog``), and a gap of more than two
intervals since the previous one raises a ``watchdog_late`` alert.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

from workers import tracing
from workers.celery_app import control_app as app
from workers.core.run_health import watchdog_late
from workers.runtime import now_ms, runtime, worker_id
from workers.store.ledger import Ledger
from workers.store.sessions import SessionStore
from workers.store.watchdog_liveness import WatchdogLiveness
from workers.task_events import TaskEvents
from workers.task_names import HOUSEKEEPING_TASK, SWEEP_TASK
from workers.watchdog.alerts import AlertSink
from workers.watchdog.sweep import Watchdog, clean_stale_lanes

__all__ = ["housekeeping", "sweep"]

log = logging.getLogger(__name__)


def _revoke(task_ids: list[str]) -> None:
    # Never terminate: a tool already running finishes under its own limits.
    app.control.revoke(task_ids, terminate=False)


@cache
def _task_events() -> TaskEvents:
    # Calls the watchdog answers close their task in Flower (their worker is gone or late).
    rt = runtime()
    flush_ms = rt.settings.broker.task_events_flush_ms
    tracing.watch_answers(rt.ledger, "watchdog")
    return TaskEvents(app, rt.ledger, role="watchdog", flush_ms=flush_ms).attach()


@cache
def _watchdog() -> Watchdog:
    rt = runtime()
    _task_events()
    return Watchdog(
        SessionStore(rt.ledger),
        rt.settings,
        writer=f"{worker_id()}/watchdog",
        alerts=AlertSink(
            rt.settings.watchdog.webhook_url,
            publish=lambda event: _publish_alert(rt.ledger, event),
        ),
        revoke=_revoke,
    )


def _publish_alert(ledger: Ledger, event: dict[str, Any]) -> None:
    tracing.alert(event)
    ledger.publish_event(str(event.get("kind", "alert")), **{k: v for k, v in event.items() if k != "kind"})


@cache
def _liveness() -> WatchdogLiveness:
    return WatchdogLiveness(runtime().ledger)


@app.task(name=SWEEP_TASK, ignore_result=True, shared=False)
def sweep() -> int:
    """One watchdog sweep; returns how many calls it answered (0 when another sweep held the lock)."""
    watchdog = _watchdog()
    with tracing.span("unstuck.watchdog.sweep") as note:
        report = watchdog.sweep(now_ms())
        note("unstuck.sweep.calls_answered", report.calls_answered)
    if report.locked_out:
        log.info("watchdog sweep skipped: another sweep holds the lock")
        return 0
    if report.calls_answered or report.timed_out or report.recovered or report.alerts:
        log.warning("watchdog sweep: %s", report)
        _task_events().flush(timeout_s=2.0)
    _note_completed(watchdog)
    return report.calls_answered


def _note_completed(watchdog: Watchdog) -> None:
    """Record the sweep; alert when the gap since the previous one shows the watchdog fell behind."""
    done_ms = now_ms()
    gap_ms = _liveness().sweep_completed(done_ms)
    interval_ms = int(watchdog.settings.watchdog.interval_s * 1000)
    if gap_ms is not None and watchdog_late(gap_ms, interval_ms=interval_ms):
        watchdog.alerts.emit({"kind": "watchdog_late", "gap_ms": gap_ms, "interval_ms": interval_ms})


@app.task(name=HOUSEKEEPING_TASK, ignore_result=True, shared=False)
def housekeeping() -> int:
    """Release lanes whose run ended, expired or outlived its lease; returns how many."""
    return clean_stale_lanes(_watchdog().sessions, now_ms())
