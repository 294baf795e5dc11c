"""Ending a run the loop detector aborted, and the exception its caller gets."""

from __future__ import annotations

import logging
from collections.abc import Callable

from workers.core.models import SyntheticReason, ToolResult
from workers.core.run_health import RunStatus
from workers.errors import CompactionLoopPersisted, LoopDetected, StoreError
from workers.gateway.waiting import Batch
from workers.store.ledger import Ledger
from workers.store.runs import RunAbort, mark_run_aborted
from workers.store.sessions import SessionStore

__all__ = ["abort_run"]

log = logging.getLogger(__name__)


def abort_run(
    sessions: SessionStore,
    ledger: Ledger,
    batch: Batch,
    known: RunAbort | None,
    results: list[ToolResult],
    now_ms: Callable[[], int],
    writer: str,
) -> LoopDetected:
    """Record a loop abort decided in this batch (unless ``known``), answer the run's open calls.

    Returns the exception to raise, carrying one result per call.
    """
    abort = known
    if abort is None:
        assert batch.abort is not None
        verdict = batch.abort
        detector = verdict.detector.value if verdict.detector else "loop"
        abort = RunAbort(detector, verdict.count, verdict.message)
        session, run = batch.keys.session_key, batch.keys.run_id
        try:
            now = now_ms()
            sessions.end_run(session, run, RunStatus.ABORTED, now, reason=detector, release=False)
            mark_run_aborted(ledger, batch.keys, abort, now_ms=now)
            sessions.answer_open_calls(
                session,
                run,
                SyntheticReason.RUN_ABORTED,
                now_ms=now,
                writer=writer,
                detail=f" by the loop detector ({abort.detector})",
            )
            sessions.close_run(session, run, now_ms())
        except StoreError as exc:
            log.warning("could not record the abort of run %s: %s", batch.keys.run_id, exc)
    cls = CompactionLoopPersisted if abort.detector == "compaction_loop_persisted" else LoopDetected
    error = cls(abort.detector, abort.count, abort.message)
    error.results = results
    return error
