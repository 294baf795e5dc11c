"""The invoke task: claim the call, run the tool under its limits, store exactly one result."""

from __future__ import annotations

import logging
import time
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded
from celery.exceptions import Ignore, Reject
from pydantic import ValidationError

from tasks.requests import answer_if_holder_died, memory_limit_mb, report_outcome, stored_answer
from workers import tracing
from workers.celery_app import app
from workers.core.job_digest import job_digest
from workers.core.memory_limits import OomCause
from workers.core.models import CallJob, ClaimStatus, ToolResult
from workers.core.refusals import RefusalReason
from workers.core.results import answer_by_deadline, not_allowed_result
from workers.errors import CallFailed
from workers.runtime import Runtime, now_ms, runtime, worker_id
from workers.store.keys import RunKeys
from workers.task_names import INVOKE_TASK
from workers.tools.context import ToolContext
from workers.worker.cancel_enforcer import cancel_check
from workers.worker.execution import bounded_result, memory_exceeded_result, run_tool, soft_timeout_result
from workers.worker.memory_guard import memory_guard
from workers.worker.refusing import record_refusal, refuse_claim

__all__ = ["invoke"]

log = logging.getLogger(__name__)


# shared=False: registered on the tool worker's app only, never on the watchdog's.
# throws: a call that failed is an expected outcome, logged without a traceback.
@app.task(
    name=INVOKE_TASK,
    bind=True,
    ignore_result=True,
    shared=False,
    throws=(CallFailed,),
    Request="tasks.requests:GuardedRequest",
)
def invoke(self: Any, job: dict[str, Any], loop_warning: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one tool call; the task ends as the call did (see ``workers.core.outcome``).

    Returns the outcome's info for a tool's success; raises its :class:`CallFailed` (no retry:
    the message was acked on receipt and the ledger already holds the answer) otherwise.
    """
    rt = runtime()
    try:
        parsed = CallJob.model_validate(job)
    except ValidationError as exc:
        # A forged or corrupt message: nothing to run and no call to answer.
        record_refusal(rt.ledger, self.request.id, RefusalReason.UNREADABLE, str(exc.errors()[:3]))
        raise Reject(f"refused: not a call ({exc.error_count()} problem(s))", requeue=False) from None
    keys = rt.ledger.keys(parsed.session_key, parsed.run_id)
    claim = rt.ledger.claim(
        keys,
        parsed.call.id,
        worker_id=worker_id(),
        now_ms=now_ms(),
        tool=parsed.call.name,
        job_digest=job_digest(parsed),
        submitted_ms=parsed.submitted_ms,
    )
    # Only the job a gateway registered runs: anything else is refused here, before any tool code.
    # The refused message is not the call's own task, so it reports no outcome of the call.
    if refuse_claim(
        rt.ledger, keys, parsed, claim, task_id=self.request.id, writer=worker_id(), now_ms=now_ms()
    ):
        raise Reject(f"refused: {claim.status.value}", requeue=False)
    if claim.status is ClaimStatus.BUSY and not answer_if_holder_died({"job": job}):
        # A second delivery while the holder still runs: the holder's task reports the call.
        raise Ignore()
    stored = None
    if claim.status is ClaimStatus.CLAIMED:
        flush = rt.settings.worker.flush_spans_each_call
        with tracing.run_span(self.request, keys, parsed.call, claim.attempt, flush=flush) as span:
            stored = span.ended(_answer(rt, keys, parsed, self.request.id, claim.attempt))
    # Whoever answered first (this task, the gateway, the watchdog) decides how the task ends.
    return report_outcome(stored or stored_answer(rt, keys, parsed.call.id), loop_warning)


def _answer(rt: Runtime, keys: RunKeys, parsed: CallJob, task_id: str, attempt: int) -> ToolResult | None:
    """Run the claimed call (or refuse it) and store its answer; returns it if it was first.

    A result that came too late is kept for audit.
    """
    if not rt.settings.tool_policy(parsed.agent_id).allows(parsed.call.name):
        # Defence in depth: the gateway refuses these; a message that got here anyway runs nothing.
        record_refusal(
            rt.ledger,
            task_id,
            RefusalReason.TOOL_NOT_ALLOWED,
            f"tool {parsed.call.name!r} not allowed for agent {parsed.agent_id!r}",
        )
        result = not_allowed_result(
            parsed.call, parsed.agent_id, elapsed_ms=now_ms() - parsed.submitted_ms, attempt=0
        )
    else:
        result = bounded_result(_execute(rt, parsed, attempt), max_bytes=rt.settings.limits.max_result_bytes)
    finished_ms = now_ms()
    answer = answer_by_deadline(
        result,
        parsed.call,
        submitted_ms=parsed.submitted_ms,
        deadline_ms=parsed.deadline_ms,
        now_ms=finished_ms,
    )
    submitted_ms = parsed.submitted_ms
    won = rt.ledger.finish(keys, answer, now_ms=finished_ms, writer=worker_id(), submitted_ms=submitted_ms)
    if answer is not result:  # kept as late (audit)
        rt.ledger.finish(keys, result, now_ms=finished_ms, writer=worker_id(), submitted_ms=submitted_ms)
    # The ledger stored the configured fallback if one covers this answer: report what it holds.
    return rt.ledger.with_fallback(answer) if won else None


def _execute(rt: Runtime, job: CallJob, attempt: int) -> ToolResult:
    ctx = _context(rt, job, attempt)
    allows = rt.settings.tool_policy(job.agent_id).allows  # a fail-branch obeys it too
    limit_mb = memory_limit_mb(rt, job.call.name)
    try:
        with memory_guard().limit(limit_mb) as memory:
            result = run_tool(
                job,
                ctx,
                clock_ms=now_ms,
                sleep=time.sleep,
                interrupts=(SoftTimeLimitExceeded,),
                rules=rt.rules,
                allows=allows,
            )
    except SoftTimeLimitExceeded:
        # Caught first: billiard derives it from Exception, so a broad handler would hide it.
        return soft_timeout_result(job, ctx, attempt=attempt, clock_ms=now_ms, rules=rt.rules, allows=allows)
    except MemoryError:
        # Here the limit is lifted and what the tool held is freed: building the answer is safe.
        return _past_memory_limit(rt, job, OomCause.ALLOCATION_REFUSED, limit_mb, attempt)
    if memory.oom_kills:
        return _past_memory_limit(rt, job, OomCause.PROCESS_KILLED, limit_mb, attempt, partial=result.text)
    return result


def _past_memory_limit(
    rt: Runtime, job: CallJob, cause: OomCause, limit_mb: int | None, attempt: int, partial: object = None
) -> ToolResult:
    return memory_exceeded_result(
        job,
        cause,
        limit_mb=limit_mb,
        elapsed_ms=now_ms() - job.submitted_ms,
        attempt=attempt,
        rules=rt.rules,
        partial=partial,
    )


def _context(rt: Runtime, job: CallJob, attempt: int) -> ToolContext:
    keys = rt.ledger.keys(job.session_key, job.run_id)
    call_id = job.call.id
    return ToolContext(
        session_key=job.session_key,
        run_id=job.run_id,
        call_id=call_id,
        attempt=attempt,
        deadline_ms=job.deadline_ms,
        clock=time.monotonic,
        on_heartbeat=lambda details: rt.ledger.heartbeat(keys, call_id, now_ms=now_ms(), details=details),
        on_process_group=lambda pgid: rt.ledger.add_process_group(keys, call_id, pgid),
        on_cancel_check=cancel_check(rt.ledger, keys, call_id),
        cancel_grace_s=rt.settings.limits.cancel_grace_s,
    )
