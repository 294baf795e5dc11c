"""Task names: the one place they are spelled (a leaf module, so anyone may import it).

``workers.celery_edge.app`` (routing), ``tasks/`` (registration) and ``beat_schedule.py`` (the
schedule) all refer to these constants; a renamed task cannot drift apart between them.
"""

from __future__ import annotations

__all__ = ["HOUSEKEEPING_TASK", "INVOKE_TASK", "SWEEP_TASK", "invoke_task_id", "invoke_task_label"]

INVOKE_TASK = "unstuck.invoke"
"""Run one tool call (tool queue, tool workers)."""

SWEEP_TASK = "unstuck.watchdog.sweep"
"""One watchdog sweep (beat-scheduled)."""

HOUSEKEEPING_TASK = "unstuck.watchdog.housekeeping"
"""Release stale session lanes (beat-scheduled)."""


def invoke_task_id(due_member: str, attempt: int) -> str:
    """The task id of one dispatch of a call: its due-index member (session/run/call) and attempt.

    Readable and searchable in Flower; a call answered at submission is shown under attempt 0.
    """
    return f"{due_member}#{attempt}"


def invoke_task_label(tool: str, session_key: str, run_id: str) -> str:
    """The name Flower shows for a call's task (Celery's ``shadow``): tool, session and run."""
    return f"{tool} [{session_key}/{run_id}]"
