"""Beat-driven watchdog tasks: the sweep (every ``watchdog.interval_s``) and housekeeping."""

from __future__ import annotations

import logging
from functools import cache

from workers.celery_app import app
from workers.runtime import now_ms, runtime, worker_id
from workers.store.sessions import SessionStore
from workers.task_names import HOUSEKEEPING_TASK, SWEEP_TASK
from workers.watchdog.alerts import AlertSink
from workers.watchdog.sweep import Watchdog, clean_stale_lanes

__all__ = ["housekeeping", "sweep"]

log = logging.getLogger(__name__)


def _revoke(task_ids: list[str]) -> None:
    # Never terminate: a tool already running finishes under its own limits.
    app.control.revoke(task_ids, terminate=False)


@cache
def _watchdog() -> Watchdog:
    rt = runtime()
    return Watchdog(
        SessionStore(rt.ledger),
        rt.settings,
        writer=f"{worker_id()}/watchdog",
        alerts=AlertSink(
            rt.settings.watchdog.webhook_url,
            publish=lambda event: rt.ledger.publish_event(
                str(event.get("kind", "alert")), **{k: v for k, v in event.items() if k != "kind"}
            ),
        ),
        revoke=_revoke,
    )


@app.task(name=SWEEP_TASK, ignore_result=True)
def sweep() -> int:
    """One watchdog sweep; returns how many calls it answered (0 when another sweep held the lock)."""
    report = _watchdog().sweep(now_ms())
    if report.locked_out:
        log.info("watchdog sweep skipped: another sweep holds the lock")
    elif report.calls_answered or report.timed_out or report.recovered or report.alerts:
        log.warning("watchdog sweep: %s", report)
    return report.calls_answered


@app.task(name=HOUSEKEEPING_TASK, ignore_result=True)
def housekeeping() -> int:
    """Release lanes whose run ended, expired or outlived its lease; returns how many."""
    return clean_stale_lanes(_watchdog().sessions, now_ms())
