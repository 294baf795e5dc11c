"""The invoke task's Celery request: its hard-limit and lost-child paths still answer the call.

The answering itself is the worker's (:mod:`workers.worker.lost_calls`). This class uses the
hooks Celery documents for a task's ``Request`` class (``on_timeout`` and ``on_failure``, with
its ``send_failed_event``): each failure is answered, and the task's closing event is the one
of the call's stored answer instead of Celery's ``task-failed``. ``on_accepted`` (the request's
documented start) tells the worker its message is no longer held
(:mod:`workers.celery_edge.give_back`).
"""

from __future__ import annotations

import logging
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded, Terminated, TimeLimitExceeded
from celery.exceptions import Ignore, Reject, Retry
from celery.worker.request import Request

from workers.core.models import SyntheticReason, ToolResult
from workers.core.outcome import closing_event, failure_event, outcome_of
from workers.errors import CallFailed, StoreError
from workers.runtime import runtime
from workers.worker.held_messages import held_messages
from workers.worker.lost_calls import (
    answer_escaped_soft_limit,
    answer_from_main_process,
    answer_lost_child,
    job_of,
    pid_of,
    stored_answer,
)

__all__ = ["GuardedRequest"]

log = logging.getLogger(__name__)

# Ends of a task with no lost or failed tool behind them: nothing to answer. (A child that
# exits, or a task terminated from Flower, is answered ``crashed`` like any lost child.)
_NOT_A_LOSS = (Ignore, Reject, Retry)
# Ends for which Celery sends no task-failed of its own (a retry, an ignored task, a task
# terminated from Flower: task-revoked), so none of ours replaces it.
_NO_FAILED_EVENT = (Ignore, Retry, Terminated)


class GuardedRequest(Request):
    """A Celery request whose hard-limit and lost-child paths still answer the call.

    Every failure closes the task with the call's stored answer (its reason, no traceback of
    ours), so Flower shows what the agent was told rather than a pool error.
    """

    _failure: CallFailed | None = None
    _timed_out = False  # on_failure already handled this task's hard limit

    def on_accepted(self, pid: str, time_accepted: float) -> None:
        """A pool child started this task: the worker no longer holds its message."""
        _no_longer_held(self)
        super().on_accepted(pid, time_accepted)

    def on_timeout(self, soft: bool, timeout: float) -> None:
        """Hard limit: the child is being killed; answer ``timeout_hard``.

        billiard reports the job failed (``TimeLimitExceeded``, to :meth:`on_failure`, which
        runs Celery's failure handling and closes the task) before it calls this; Celery's own
        hard-limit handling would do it all again and send a second, raw ``task-failed``.
        """
        if soft or not self._timed_out:
            if not soft:
                answer_from_main_process(self.kwargs, SyntheticReason.TIMEOUT_HARD)
            super().on_timeout(soft, timeout)
            return
        log.error("Hard time limit (%ss) exceeded for %s[%s]", timeout, self.name, self.id)

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> None:
        """A child that died (OOM, SIGKILL, segfault) surfaces as WorkerLostError here."""
        _no_longer_held(self)  # e.g. its child died before it accepted the task
        exc = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # billiard wraps pool errors in ExceptionWithTraceback
        if isinstance(exc, CallFailed):
            self._failure = exc  # the task body reported the call's outcome
        elif isinstance(exc, TimeLimitExceeded):
            answer_from_main_process(self.kwargs, SyntheticReason.TIMEOUT_HARD)
            self._timed_out = True
        elif isinstance(exc, SoftTimeLimitExceeded):
            # The interrupt hit unstuck's code around the tool (the tool's own is answered by the
            # task): the child lives on, so this is a time limit, not a lost child.
            answer_escaped_soft_limit(self.kwargs, self.time_start, detail=f"{type(exc).__name__}: {exc}")
        elif exc is not None and not isinstance(exc, _NOT_A_LOSS):
            # A lost child, or the task body itself failed (e.g. the store vanished mid-call).
            detail = f"{type(exc).__name__}: {exc}"
            answer_lost_child(self.kwargs, pid_of(str(self.worker_pid or "")), detail=detail)
        ours = send_failed_event and self._replaces_failed_event(exc)
        event = self._closing_event() if ours else None
        # Celery's own task-failed only when the call has no answer to show instead.
        celerys = send_failed_event and event is None
        super().on_failure(exc_info, send_failed_event=celerys, return_ok=return_ok)
        self._close(event)

    def _replaces_failed_event(self, exc: object) -> bool:
        """Whether Celery would close this task with a task-failed, and events are on."""
        requeued = isinstance(exc, Reject) and bool(getattr(exc, "requeue", False))
        if exc is None or requeued or isinstance(exc, _NO_FAILED_EVENT):
            return False
        eventer = getattr(self, "eventer", None)  # None or disabled: Celery sends no event
        return eventer is not None and bool(eventer.enabled)

    def _close(self, event: tuple[str, dict[str, Any]] | None) -> None:
        if event is not None:
            type, fields = event
            self.send_event(type, **{"name": self.name, **fields})  # named after the call

    def _closing_event(self) -> tuple[str, dict[str, Any]] | None:
        """The event of the call's answer: its failure, or the answer stored (None: none stored)."""
        if self._failure is not None:
            return failure_event(self._failure)
        answer = self._stored_answer()
        return None if answer is None else closing_event(outcome_of(answer))

    def _stored_answer(self) -> ToolResult | None:
        job = job_of(self.kwargs)
        if job is None:
            return None
        rt = runtime()
        try:
            return stored_answer(rt, rt.ledger.keys(job.session_key, job.run_id), job.call.id)
        except StoreError:
            return None  # Celery's own failure event still closes the task


def _no_longer_held(request: GuardedRequest) -> None:
    held = held_messages()  # None when the worker gives nothing back (give_back_after_ms 0)
    if held is not None:
        held.started(request)
