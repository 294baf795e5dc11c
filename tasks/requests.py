"""Answer a call whose pool child was killed or hit its hard limit.

The task's own code never runs again after a hard kill, so the result is written here: in
the worker's main process right after the pool reports the loss, or by the next delivery of
the same call on this host when it finds the claim held by a child that no longer exists
(the pool may redeliver a job whose child died before it reported the job accepted).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
from typing import Any

import psutil
from billiard.exceptions import TimeLimitExceeded
from celery.exceptions import Ignore, Reject, Retry
from celery.worker.request import Request
from pydantic import ValidationError

from workers import tracing
from workers.core.heartbeats import ChildVerdict, RunningCall, judge_running_call
from workers.core.memory_limits import lost_child_reason, resolve_memory_limit_mb
from workers.core.models import CallJob, SyntheticReason, ToolResult
from workers.core.outcome import TaskState, closing_event, failure_event, outcome_of
from workers.core.results import answer_by_deadline
from workers.errors import CallFailed, StoreError
from workers.runtime import Runtime, now_ms, runtime, worker_id
from workers.store.keys import RunKeys
from workers.store.records import CallField
from workers.worker.execution import interrupted_result
from workers.worker.memory_guard import memory_guard

__all__ = [
    "GuardedRequest",
    "answer_from_main_process",
    "answer_if_holder_died",
    "answer_lost_child",
    "memory_limit_mb",
    "pid_alive",
    "pid_of",
    "report_outcome",
    "stored_answer",
]

log = logging.getLogger(__name__)


def _job(kwargs: dict[str, Any]) -> CallJob | None:
    try:
        return CallJob.model_validate(kwargs.get("job", {}))
    except ValidationError:
        return None


def answer_from_main_process(kwargs: dict[str, Any], reason: SyntheticReason, detail: str = "") -> None:
    """Write the synthetic result for a call whose child died, and kill its process groups."""
    job = _job(kwargs)
    if job is None:
        return
    rt = runtime()
    keys = rt.ledger.keys(job.session_key, job.run_id)
    try:
        for pgid in rt.ledger.process_groups(keys, job.call.id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        record = rt.ledger.record(keys, job.call.id)
        attempt = record.row.integer(CallField.ATTEMPT) if record else 1
        result = interrupted_result(
            job,
            rt.tools.get(job.call.name),
            reason,
            elapsed_ms=now_ms() - job.submitted_ms,
            attempt=attempt,
            rules=rt.rules,
            memory_limit_mb=memory_limit_mb(rt, job.call.name),
        )
        if detail:
            result = result.model_copy(update={"details": {**result.details, "detail": detail}})
        finished_ms = now_ms()
        answer = answer_by_deadline(
            result, job.call, submitted_ms=job.submitted_ms, deadline_ms=job.deadline_ms, now_ms=finished_ms
        )
        if rt.ledger.finish(keys, answer, now_ms=finished_ms, writer=f"{worker_id()}/main") and record:
            # The child's unstuck.run span died with it: ended here, under the same id.
            tracing.child_lost(record.fields, keys.session_key, keys.run_id, job.call, answer,
                               record.row.integer(CallField.STARTED_MS))  # fmt: skip
    except StoreError as exc:
        # The gateway and watchdog still answer this call by its lease or deadline.
        log.warning("could not record %s for call %s: %s", reason.value, job.call.id, exc)


def memory_limit_mb(rt: Runtime, tool_name: str) -> int | None:
    """The memory limit calls of ``tool_name`` run under on this worker (None: unlimited)."""
    spec = rt.tools.get(tool_name)
    return resolve_memory_limit_mb(
        tool_name,
        configured=rt.settings.tools.memory_limits_mb,
        declared=spec.memory_limit_mb if spec else None,
        default=rt.settings.limits.memory_limit_mb,
    )


def pid_of(worker: str | None) -> int | None:
    """The pid of a ``host:pid`` worker id (or of a bare pid), None if it names none."""
    pid = (worker or "").rsplit(":", 1)[-1]
    return int(pid) if pid.isdigit() else None


def answer_lost_child(kwargs: dict[str, Any], child_pid: int | None, detail: str) -> None:
    """Answer the call of a pool child that died: ``out_of_memory`` or ``crashed``.

    ``out_of_memory`` when the kernel's OOM killer killed a process of the call: its cgroup's
    ``oom_kill`` counter says so (a SIGKILL alone does not).
    """
    kills = memory_guard().lost_child_oom_kills(child_pid) if child_pid is not None else 0
    answer_from_main_process(kwargs, lost_child_reason(kills), detail=detail)


def pid_alive(worker: str) -> bool:
    """Whether the process of a ``host:pid`` worker id (on this host) is alive and not a zombie."""
    pid = worker.rsplit(":", 1)[-1]
    try:
        return psutil.Process(int(pid)).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False  # AccessDenied: the pid now belongs to another user, so not to our pool


def answer_if_holder_died(kwargs: dict[str, Any]) -> bool:
    """Answer ``crashed`` when the call's claim is held by a dead child of this host; True if so."""
    job = _job(kwargs)
    if job is None:
        return False
    rt = runtime()
    keys = rt.ledger.keys(job.session_key, job.run_id)
    try:
        ((state, holder, last_beat),) = rt.ledger.running_states([(keys, job.call.id)])
    except StoreError:
        return False  # the gateway and watchdog still answer it by its lease
    call = RunningCall(state, holder, last_beat, None)
    verdict = judge_running_call(
        call, host=socket.gethostname(), child_alive=pid_alive(holder), now_ms=now_ms()
    )
    if verdict is not ChildVerdict.CHILD_DIED:
        return False
    answer_lost_child(kwargs, pid_of(holder), detail=f"pool process {holder} died")
    return True


def stored_answer(rt: Runtime, keys: RunKeys, call_id: str) -> ToolResult | None:
    """The answer the ledger holds for a call (the first stored, whoever wrote it)."""
    return rt.ledger.results(keys, [call_id]).get(call_id)


def report_outcome(answer: ToolResult | None, loop_warning: dict[str, Any] | None = None) -> dict[str, Any]:
    """End the task as the call ended: the outcome's info for a tool's success, else raise its failure.

    No answer (the record expired, or the message named no registered call): nothing to
    report, so the task's state is left alone.
    """
    if answer is None:
        raise Ignore()
    outcome = outcome_of(answer, loop_warning)
    if outcome.state is TaskState.SUCCESS:
        return outcome.info()
    raise outcome.failure()


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
        eventer = getattr(self, "_eventer", None)  # Celery's; None or disabled: nothing is sent
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
        job = _job(self.kwargs)
        if job is None:
            return None
        rt = runtime()
        try:
            return stored_answer(rt, rt.ledger.keys(job.session_key, job.run_id), job.call.id)
        except StoreError:
            return None  # Celery's own failure event still closes the task
