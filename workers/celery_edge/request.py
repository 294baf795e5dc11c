"""The invoke task's Celery request: its hard-limit and lost-child paths still answer the call.

The answering itself is the worker's (:mod:`workers.worker.lost_calls`); this class only hooks
Celery's request callbacks and rewrites the ``task-failed`` event it sends.
:func:`held_invoke_requests` lists the requests of this class the worker holds, for the lease
keeper in the main process.
"""

from __future__ import annotations

from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded
from celery.exceptions import Ignore, Reject, Retry
from celery.worker import state
from celery.worker.request import Request

from workers.core.models import SyntheticReason, ToolResult
from workers.core.outcome import closing_event, failure_event, outcome_of
from workers.errors import CallFailed, StoreError
from workers.runtime import runtime
from workers.worker.lost_calls import (
    answer_escaped_soft_limit,
    answer_from_main_process,
    answer_lost_child,
    job_of,
    pid_of,
    stored_answer,
)

__all__ = ["GuardedRequest", "held_invoke_requests"]


# Ends of a task with no lost or failed tool behind them: nothing to answer. (A child that
# exits, or a task terminated from Flower, is answered ``crashed`` like any lost child.)
_NOT_A_LOSS = (Ignore, Reject, Retry)


class GuardedRequest(Request):
    """A Celery request whose hard-limit and lost-child paths still answer the call.

    Every failure closes the task with the call's stored answer (its reason, no traceback of
    ours), so Flower shows what the agent was told rather than a pool error.
    """

    _failure: CallFailed | None = None

    def on_timeout(self, soft: bool, timeout: float) -> None:
        """Hard limit: the child is being killed; answer ``timeout_hard`` before Celery's own handling."""
        if not soft:
            answer_from_main_process(self.kwargs, SyntheticReason.TIMEOUT_HARD)
        super().on_timeout(soft, timeout)

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> None:
        """A child that died (OOM, SIGKILL, segfault) surfaces as WorkerLostError here."""
        exc = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # billiard wraps pool errors in ExceptionWithTraceback
        if isinstance(exc, CallFailed):
            self._failure = exc  # the task body reported the call's outcome
        elif isinstance(exc, TimeLimitExceeded):
            answer_from_main_process(self.kwargs, SyntheticReason.TIMEOUT_HARD)
        elif isinstance(exc, SoftTimeLimitExceeded):
            # The interrupt hit unstuck's code around the tool (the tool's own is answered by the
            # task): the child lives on, so this is a time limit, not a lost child.
            answer_escaped_soft_limit(self.kwargs, self.time_start, detail=f"{type(exc).__name__}: {exc}")
        elif exc is not None and not isinstance(exc, _NOT_A_LOSS):
            # A lost child, or the task body itself failed (e.g. the store vanished mid-call).
            detail = f"{type(exc).__name__}: {exc}"
            answer_lost_child(self.kwargs, pid_of(str(self.worker_pid or "")), detail=detail)
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

    def send_event(self, type: str, **fields: Any) -> None:
        """Celery's ``task-failed`` becomes the event of the call's stored answer (reason, no traceback).

        Both the pool's failure report and the hard-limit handler send one; each is replaced.
        Every event carries the task's name (tool, session and run).
        """
        eventer = self.eventer  # None or disabled: Celery sends nothing
        if type == "task-failed" and eventer is not None and eventer.enabled:
            type, fields = self._closing_event(type, fields)
        # The client's task-sent (named after the task, not the call) may reach Flower after
        # task-received and rename the task; each later event names it after the call again.
        super().send_event(type, **{"name": self.name, **fields})

    def _closing_event(self, type: str, fields: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if self._failure is not None:
            return failure_event(self._failure)
        answer = self._stored_answer()
        return (type, fields) if answer is None else closing_event(outcome_of(answer))

    def _stored_answer(self) -> ToolResult | None:
        job = job_of(self.kwargs)
        if job is None:
            return None
        rt = runtime()
        try:
            return stored_answer(rt, rt.ledger.keys(job.session_key, job.run_id), job.call.id)
        except StoreError:
            return None  # Celery's own failure event still closes the task


def held_invoke_requests() -> list[GuardedRequest]:
    """The invoke requests this worker holds: received and not done yet (Celery's worker state).

    ``reserved_requests`` also holds requests whose start the pool has not acknowledged yet, so
    a child that dies right after claiming is still seen. No public API lists them:
    ``task_received`` says when one arrives, but nothing of ours runs in the main process when
    one succeeds (Celery derives a request class from this one whose ``on_success`` calls no
    hook), and a finished call must leave the list before its pool child takes the next one.
    """
    for _ in range(3):
        try:
            return [req for req in list(state.reserved_requests) if isinstance(req, GuardedRequest)]
        except RuntimeError:  # another thread changed the set while it was copied; try again
            continue
    return []
