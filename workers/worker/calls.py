"""One delivery of a call's message: claim it, refuse it or run it, and store exactly one answer.

The invoke task (``tasks/invoke.py``) hands each delivery here and ends as the answer says.
Only the job a gateway registered runs: anything else is refused before any tool code. The
tool runs under its limits (soft limit, memory, cancel, heartbeat), its result is bounded,
answered by the call's deadline and stored first-writer-wins.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded
from pydantic import ValidationError

from workers import tracing
from workers.answering.service import Answered, Answers
from workers.core.job_digest import digest_of
from workers.core.memory_limits import OomCause
from workers.core.models import CallJob, ClaimStatus, ToolResult
from workers.core.refusal import RefusalReason
from workers.core.results import answer_by_deadline, not_allowed_result
from workers.runtime import Runtime, now_ms, runtime, worker_id
from workers.store.keys import RunKeys
from workers.tools.context import ToolContext
from workers.worker.cancel import cancel_check
from workers.worker.duplicates import note_duplicate
from workers.worker.execution import bounded_result, memory_exceeded_result, run_tool, soft_timeout_result
from workers.worker.lost_calls import answer_if_holder_died, memory_limit_mb, stored_answer, worker_answers
from workers.worker.memory_guard import memory_guard
from workers.worker.refusal import record_refusal, refuse_claim

__all__ = ["Refused", "answer_call"]

# A claim refused because the call is another delivery's: a live one (busy) or a lost one.
_HELD_ELSEWHERE = frozenset({ClaimStatus.BUSY, ClaimStatus.LOST})


@dataclass(frozen=True)
class Refused:
    """The message is not a registered call's job: nothing ran, and it reports no outcome of a call."""

    message: str


def answer_call(
    job: dict[str, Any], *, canonical: bytes, task_id: str, trace_from: object = None
) -> ToolResult | Refused | None:
    """Handle one delivery of ``job``: the call's stored answer, a refusal, or None.

    ``trace_from``: the task's request, whose message headers hold the call's trace context.
    ``canonical``: ``job`` as received, serialised by ``canonical_json`` (the pool child's slot
    holds the same bytes): what the claim's digest is taken of.

    The answer is whoever's came first (this delivery, the gateway, the watchdog). None: nothing
    for this delivery to report (another live delivery runs the call, or ran it and was lost, its
    record expired, or it came past the call's deadline before anyone answered it).
    """
    rt = runtime()
    try:
        parsed = CallJob.model_validate(job)
    except ValidationError as exc:
        # A forged or corrupt message: nothing to run and no call to answer.
        record_refusal(rt.ledger, task_id, RefusalReason.UNREADABLE, str(exc.errors()[:3]))
        return Refused(f"refused: not a call ({exc.error_count()} problem(s))")
    keys = rt.ledger.keys(parsed.session_key, parsed.run_id)
    claim = rt.ledger.claim(
        keys,
        parsed.call.id,
        worker_id=worker_id(),
        now_ms=now_ms(),
        tool=parsed.call.name,
        job_digest=digest_of(canonical),  # the bytes received, as the gateway registered them
        submitted_ms=parsed.submitted_ms,
        deadline_ms=parsed.deadline_ms,
    )
    if claim.status is ClaimStatus.EXPIRED:
        # Too late to run, and nobody answered it yet: its gateway or the watchdog will. This is
        # the message's expiry, which Celery's main process no longer checks (celery_edge/messages.py).
        return None
    answers = worker_answers(rt, worker_id())
    if refuse_claim(rt.ledger, keys, parsed, claim, task_id=task_id, answers=answers, now_ms=now_ms()):
        return Refused(f"refused: {claim.status.value}")
    if claim.status in _HELD_ELSEWHERE and not answer_if_holder_died({"job": job}):
        # A second delivery while the holder runs (its task reports), or after it was lost
        # (its gateway or the watchdog requeues or answers the call).
        return None
    note_duplicate(rt.ledger, keys, parsed.call.id, claim, worker=worker_id())
    if claim.status is not ClaimStatus.CLAIMED:
        return stored_answer(rt, keys, parsed.call.id)
    flush = rt.settings.worker.flush_spans_each_call
    with tracing.run_span(
        trace_from, keys, parsed.call, claim.attempt, flush=flush, ledger=rt.ledger
    ) as span:
        answered = _answer(rt, answers, keys, parsed, task_id, claim.attempt)
        span.ended(answered.result if answered.won else None)
    return answered.result


def _answer(
    rt: Runtime, answers: Answers, keys: RunKeys, parsed: CallJob, task_id: str, attempt: int
) -> Answered:
    """Run the claimed call (or refuse it) and store its answer; the call's one answer (the kept one).

    A result that came too late is kept for audit.
    """
    allows = rt.settings.tool_policy(parsed.agent_id).allows
    if not allows(parsed.call.name):
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
        ran = _execute(rt, keys, parsed, attempt, allows)
        result = bounded_result(ran, max_bytes=rt.settings.limits.max_result_bytes)
    finished_ms = now_ms()
    answer = answer_by_deadline(
        result,
        parsed.call,
        submitted_ms=parsed.submitted_ms,
        deadline_ms=parsed.deadline_ms,
        now_ms=finished_ms,
    )
    submitted_ms = parsed.submitted_ms
    answered = answers.answer(keys, answer, now_ms=finished_ms, submitted_ms=submitted_ms).on(rt.ledger)
    if answer is not result:  # kept as late (audit)
        answers.offer(keys, result, now_ms=finished_ms, submitted_ms=submitted_ms).on(rt.ledger)
    return answered


def _execute(
    rt: Runtime, keys: RunKeys, job: CallJob, attempt: int, allows: Callable[[str], bool]
) -> ToolResult:
    """Run the tool; ``allows``: the agent's tool policy, which a fail-branch obeys too."""
    ctx = _context(rt, keys, job, attempt)
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
        partial=partial,
    )


def _context(rt: Runtime, keys: RunKeys, job: CallJob, attempt: int) -> ToolContext:
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
