"""The watchdog's tasks: the sweep (every ``watchdog.interval_s``) and housekeeping.

Registered only on the control app, consumed only from ``broker.control_queue`` by
``unstuck watchdog``: no tool worker runs them, so nothing the watchdog watches can starve it.
What they do is :class:`workers.watchdog.service.WatchdogService`'s.
"""

from __future__ import annotations

from functools import cache

from workers.celery_edge.app import control_app as app
from workers.celery_edge.names import HOUSEKEEPING_TASK, SWEEP_TASK
from workers.runtime import runtime
from workers.watchdog.service import WatchdogService

__all__ = ["housekeeping", "sweep"]


@cache
def _service() -> WatchdogService:
    return WatchdogService(app, runtime())


@app.task(name=SWEEP_TASK, ignore_result=True, shared=False)
def sweep() -> int:
    """One watchdog sweep; returns how many calls it answered (0 when another sweep held the lock)."""
    return _service().sweep()


@app.task(name=HOUSEKEEPING_TASK, ignore_result=True, shared=False)
def housekeeping() -> int:
    """Release lanes whose run ended, expired or outlived its lease; returns how many."""
    return _service().housekeeping()
