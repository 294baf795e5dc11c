"""Ending a run the loop detector aborted, and the exception its caller gets."""

from __future__ import annotations

import logging
from collections.abc import Callable

from workers.answering.service import Answers
from workers.core.models import SyntheticReason, ToolResult
from workers.core.run_health import RunStatus
from workers.errors import CompactionLoopPersisted, LoopDetected, StoreError
from workers.gateway.batch import Abort
from workers.store.keys import RunKeys
from workers.store.sessions import SessionStore, mark_run_aborted

__all__ = ["abort_run"]

log = logging.getLogger(__name__)


def abort_run(
    sessions: SessionStore,
    answers: Answers,
    keys: RunKeys,
    abort: Abort,
    results: list[ToolResult],
    now_ms: Callable[[], int],
) -> LoopDetected:
    """Record an abort decided in this batch (one already recorded is not), answer the run's open calls.

    Returns the exception to raise, carrying one result per call.
    """
    if not abort.recorded:
        session, run = keys.session_key, keys.run_id
        try:
            now = now_ms()
            sessions.end_run(session, run, RunStatus.ABORTED, now, reason=abort.detector, release=False)
            mark_run_aborted(sessions.ledger, keys, abort.record, now_ms=now)
            detail = f" by the loop detector ({abort.detector})"
            answers.end_run(keys, SyntheticReason.RUN_ABORTED, now_ms=now, detail=detail).on(sessions.ledger)
            sessions.close_run(session, run, now_ms())
        except StoreError as exc:
            log.warning("could not record the abort of run %s: %s", keys.run_id, exc)
    cls = CompactionLoopPersisted if abort.detector == "compaction_loop_persisted" else LoopDetected
    error = cls(abort.detector, abort.count, abort.message)
    error.results = results
    return error
