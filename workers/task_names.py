"""Task names: the one place they are spelled (a leaf module, so anyone may import it).

``workers.celery_app`` (routing), ``tasks/`` (registration) and ``beat_schedule.py`` (the
schedule) all refer to these constants; a renamed task cannot drift apart between them.
"""

from __future__ import annotations

__all__ = ["HOUSEKEEPING_TASK", "INVOKE_TASK", "SWEEP_TASK"]

INVOKE_TASK = "unstuck.invoke"
"""Run one tool call (tool queue, tool workers)."""

SWEEP_TASK = "unstuck.watchdog.sweep"
"""One watchdog sweep (beat-scheduled)."""

HOUSEKEEPING_TASK = "unstuck.watchdog.housekeeping"
"""Release stale session lanes (beat-scheduled)."""
