"""Task names: the one place they are spelled (a leaf module, so anyone may import it).

``workers.celery_edge.app`` (routing), ``tasks/`` (registration) and ``beat_schedule.py`` (the
schedule) all refer to these constants; a renamed task cannot drift apart between them.
"""

from __future__ import annotations

from typing import Final

__all__ = ["HOUSEKEEPING_TASK", "INVOKE_TASK", "INVOKE_TASK_ID", "INVOKE_TASK_LABEL", "SWEEP_TASK"]

INVOKE_TASK = "unstuck.invoke"
"""Run one tool call (tool queue, tool workers)."""

SWEEP_TASK = "unstuck.watchdog.sweep"
"""One watchdog sweep (beat-scheduled)."""

HOUSEKEEPING_TASK = "unstuck.watchdog.housekeeping"
"""Release stale session lanes (beat-scheduled)."""


INVOKE_TASK_ID: Final = "{due_member}#{attempt}"
"""The task id of one dispatch of a call (``str.format`` it): its due-index member
(session/run/call) and attempt. Readable and searchable in Flower; a call answered at
submission is shown under attempt 0."""

INVOKE_TASK_LABEL: Final = "{tool} [{session_key}/{run_id}]"
"""The name Flower shows for a call's task (Celery's ``shadow``; ``str.format`` it): tool,
session and run."""
