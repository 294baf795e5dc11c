"""Answer a call whose pool child was killed, hit its hard limit, or stopped beating.

The task's own code never runs again after a hard kill, so the result is written here: in
the worker's main process right after the pool reports the loss, or by the next delivery of
the same call on this host when it finds the claim held by a child that no longer exists
(the pool may redeliver a job whose child died before it reported the job accepted).
``kwargs`` is a task message's keyword arguments (``{"job": ...}``), as Celery's request holds them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from typing import Any

import psutil
from pydantic import ValidationError

from workers import tracing
from workers.answering.service import Answers
from workers.core.call_limits import escaped_soft_limit_reason
from workers.core.heartbeats import ChildVerdict, RunningCall, judge_running_call
from workers.core.memory_limits import lost_child_reason, resolve_memory_limit_mb
from workers.core.models import CallJob, SyntheticReason, ToolResult
from workers.core.results import answer_by_deadline
from workers.errors import StoreError
from workers.runtime import Runtime, now_ms, runtime, worker_id
from workers.store.keys import RunKeys
from workers.store.records import CallField
from workers.worker.branching import declared_fallbacks
from workers.worker.execution import interrupted_result
from workers.worker.memory_guard import memory_guard

__all__ = [
    "answer_escaped_soft_limit",
    "answer_from_main_process",
    "answer_if_holder_died",
    "answer_lost_child",
    "job_of",
    "memory_limit_mb",
    "pid_alive",
    "pid_of",
    "stored_answer",
    "worker_answers",
]

log = logging.getLogger(__name__)


def job_of(kwargs: dict[str, Any]) -> CallJob | None:
    """The call job of a task's keyword arguments, None if they hold none."""
    try:
        return CallJob.model_validate(kwargs.get("job", {}))
    except ValidationError:
        return None


def answer_from_main_process(kwargs: dict[str, Any], reason: SyntheticReason, detail: str = "") -> None:
    """Write the synthetic result for a call whose child died, and kill its process groups."""
    job = job_of(kwargs)
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
            reason,
            elapsed_ms=now_ms() - job.submitted_ms,
            attempt=attempt,
            memory_limit_mb=memory_limit_mb(rt, job.call.name),
        )
        if detail:
            result = result.model_copy(update={"details": {**result.details, "detail": detail}})
        finished_ms = now_ms()
        answer = answer_by_deadline(
            result, job.call, submitted_ms=job.submitted_ms, deadline_ms=job.deadline_ms, now_ms=finished_ms
        )
        answers = worker_answers(rt, f"{worker_id()}/main")
        given = answers.given(answer)
        if answers.offer(keys, given, now_ms=finished_ms).on(rt.ledger) and record:
            # The child's unstuck.run span died with it: ended here, under the same id.
            tracing.child_lost(record.fields, keys.session_key, keys.run_id, job.call, given,
                               record.row.integer(CallField.STARTED_MS))  # fmt: skip
    except StoreError as exc:
        # The gateway and watchdog still answer this call by its lease or deadline.
        log.warning("could not record %s for call %s: %s", reason.value, job.call.id, exc)


def worker_answers(rt: Runtime, writer: str) -> Answers:
    """The answering service as this worker writes answers: the tools' declared fallbacks apply too."""
    return Answers(writer=writer, fallbacks=rt.rules.fallbacks, declared=declared_fallbacks(rt.tools))


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


def answer_escaped_soft_limit(kwargs: dict[str, Any], started_s: float | None, detail: str) -> None:
    """Answer a call whose task the soft-limit interrupt ended outside the tool.

    ``started_s``: when the task started, on the wall clock (None: it never started).
    """
    job = job_of(kwargs)
    if job is None:
        return
    now_s = time.time()
    reason = escaped_soft_limit_reason(
        started_s=now_s if started_s is None else started_s, now_s=now_s, soft_s=job.soft_s
    )
    answer_from_main_process(kwargs, reason, detail=detail)


def pid_alive(worker: str) -> bool:
    """Whether the process of a ``host:pid`` worker id (on this host) is alive and not a zombie."""
    pid = worker.rsplit(":", 1)[-1]
    try:
        return psutil.Process(int(pid)).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False  # AccessDenied: the pid now belongs to another user, so not to our pool


def answer_if_holder_died(kwargs: dict[str, Any]) -> bool:
    """Answer ``crashed`` when the call's claim is held by a dead child of this host; True if so."""
    job = job_of(kwargs)
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
