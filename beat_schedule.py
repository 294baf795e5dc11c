"""The beat schedule: entry name -> task name and interval from Settings. No logic here."""

from __future__ import annotations

from typing import Any

from workers.settings import Settings

__all__ = ["build_beat_schedule"]


def build_beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """Celery ``beat_schedule`` for ``settings``."""
    return {
        "unstuck-watchdog": {
            "task": "unstuck.watchdog.sweep",
            "schedule": settings.watchdog.interval_s,
            "options": {"expires": settings.watchdog.interval_s},
        },
    }
