"""The beat schedule: entry name -> task name and interval from Settings. No logic here."""

from __future__ import annotations

from typing import Any

from workers.celery_edge.names import HOUSEKEEPING_TASK, SWEEP_TASK
from workers.settings import Settings

__all__ = ["build_beat_schedule"]

HOUSEKEEPING_EVERY_SWEEPS = 20


def build_beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """Celery ``beat_schedule`` for ``settings``."""
    interval_s = settings.watchdog.interval_s
    housekeeping_s = max(60.0, interval_s * HOUSEKEEPING_EVERY_SWEEPS)
    return {
        "unstuck-watchdog": {
            "task": SWEEP_TASK,
            "schedule": interval_s,
            "options": {"expires": interval_s},
        },
        "unstuck-housekeeping": {
            "task": HOUSEKEEPING_TASK,
            "schedule": housekeeping_s,
            "options": {"expires": housekeeping_s},
        },
    }
