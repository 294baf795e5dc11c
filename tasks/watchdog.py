"""Beat-driven sweep: answer calls whose deadline passed or whose worker vanished."""

from __future__ import annotations

from workers.celery_app import SWEEP_TASK, app
from workers.runtime import now_ms, runtime, worker_id
from workers.sweeper import sweep_due_calls

__all__ = ["sweep"]


@app.task(name=SWEEP_TASK, ignore_result=True)
def sweep() -> int:
    """One sweep over the due index; returns how many calls it answered."""
    rt = runtime()
    return sweep_due_calls(rt.ledger, now_ms=now_ms(), settings=rt.settings, writer=f"{worker_id()}/watchdog")
