"""The client the agent loop uses: submit tool calls, get exactly one result per call, on time.

Whatever fails underneath — broker, workers, Redis — every call is answered no later than
its deadline plus ``gateway.grace_s``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis
from celery import Celery

from workers.celery_app import INVOKE_TASK, create_app
from workers.core.limits import resolve_limits
from workers.core.loops import LoopVerdict, PendingCall
from workers.core.models import CallJob, SyntheticReason, ToolCall, ToolResult
from workers.core.results import synthetic_result
from workers.core.transcript import RepairedTranscript
from workers.errors import CompactionLoopPersisted, InvalidArguments, LoopDetected, StoreError, ToolNotFound
from workers.execution import rejected_result
from workers.ledger_repair import repair_with_ledger
from workers.loop_gate import LoopGate
from workers.reaping import reap
from workers.runtime import Runtime, build_runtime, worker_id
from workers.settings import Settings, load_settings
from workers.store.keys import RunKeys
from workers.store.ledger import RunAbort, ensure_run, mark_run_aborted, run_abort
from workers.tools.registry import get_tool, validate_arguments

__all__ = ["ToolGateway"]

log = logging.getLogger(__name__)


@dataclass
class _Batch:
    """Calls of one run being waited for: call id -> deadline (ms), plus answers so far."""

    keys: RunKeys
    agent_id: str = "main"
    deadlines: dict[str, int] = field(default_factory=dict)
    pending_loops: dict[str, PendingCall] = field(default_factory=dict)
    abort: LoopVerdict | None = None
    tools: dict[str, str] = field(default_factory=dict)
    answers: dict[str, ToolResult] = field(default_factory=dict)

    @property
    def waiting(self) -> list[str]:
        return [cid for cid in self.deadlines if cid not in self.answers]


class ToolGateway:
    """Sync and asyncio API of unstuck for the agent loop."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings or load_settings()
        self._rt: Runtime = build_runtime(self.settings)
        self._app: Celery = create_app(self.settings, worker=False)
        self._clock = clock
        self._sleep = sleep
        self._writer = f"{worker_id()}/gateway"
        self._loops = LoopGate(self.settings, self._rt.ledger.client, emit=self._emit_event)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def call_tools(
        self, *, session_key: str, run_id: str, agent_id: str = "main", calls: Sequence[ToolCall]
    ) -> list[ToolResult]:
        """Run ``calls`` and return one result per call, in call order.

        Raises:
            LoopDetected: the run was aborted by the loop detector (``CompactionLoopPersisted``
                for a loop that survived compaction); ``error.results`` still holds one
                result per call.
        """
        batch = _Batch(self._rt.ledger.keys(session_key, run_id), agent_id)
        aborted = self._aborted_run(batch.keys)
        for call in calls:
            if call.id in batch.deadlines:
                continue
            if aborted is not None:
                detail = f" by the loop detector ({aborted.detector})"
                result = synthetic_result(
                    call, SyntheticReason.RUN_ABORTED, elapsed_ms=0, attempt=0, detail=detail
                )
                self._answer_now(batch, call, result)
            else:
                self._submit(batch, agent_id, call)
        self._wait(batch)
        self._record_outcomes(batch)
        results = [batch.answers[call.id] for call in calls]
        if aborted is not None or batch.abort is not None:
            raise self._abort_run(batch, aborted, results)
        return results

    async def acall_tools(
        self, *, session_key: str, run_id: str, agent_id: str = "main", calls: Sequence[ToolCall]
    ) -> list[ToolResult]:
        """``call_tools`` for asyncio callers (runs in a worker thread)."""
        return await asyncio.to_thread(
            self.call_tools, session_key=session_key, run_id=run_id, agent_id=agent_id, calls=calls
        )

    def collect(self, session_key: str, run_id: str) -> list[ToolResult]:
        """After a gateway restart: results of every call of the run, waiting for live ones.

        Calls that can no longer finish (never dispatched, worker lost, past deadline) get
        their synthetic result; the rest are awaited up to their deadline plus grace.
        """
        ledger = self._rt.ledger
        batch = _Batch(ledger.keys(session_key, run_id))
        call_ids = ledger.run_call_ids(batch.keys)
        batch.answers.update(ledger.results(batch.keys, call_ids))
        for call in ledger.open_calls(batch.keys, call_ids):
            batch.deadlines[call.call_id] = call.deadline_ms
            batch.tools[call.call_id] = call.tool
        for call_id in call_ids:
            batch.deadlines.setdefault(call_id, 0)
        self._wait(batch, undispatched_after_ms=int(self.settings.broker.publish_timeout_s * 3000))
        return [batch.answers[cid] for cid in call_ids if cid in batch.answers]

    async def acollect(self, session_key: str, run_id: str) -> list[ToolResult]:
        """``collect`` for asyncio callers."""
        return await asyncio.to_thread(self.collect, session_key, run_id)

    def repair(
        self,
        session_key: str,
        run_id: str,
        messages: Any,
        *,
        provider: str | None = None,
        model_api: str | None = None,
        model_id: str | None = None,
        fmt: str = "neutral",
    ) -> tuple[Any, RepairedTranscript]:
        """Repair a transcript for ``provider``, filling missing results from the ledger first.

        Returns the repaired messages in ``fmt`` and the full repair (report included).
        """
        keys = self._rt.ledger.keys(session_key, run_id)
        return repair_with_ledger(
            self._rt.ledger,
            keys,
            self.settings,
            messages,
            provider=provider,
            model_api=model_api,
            model_id=model_id,
            fmt=fmt,
        )

    def close(self) -> None:
        """Release connections."""
        self._rt.ledger.client.close()

    # -- submission -------------------------------------------------------------------------

    def note_compaction(self, session_key: str, run_id: str, agent_id: str = "main") -> bool:
        """Arm the post-compaction guard after the agent compacted its context.

        Returns whether the guard is enabled for the agent.
        """
        return self._loops.note_compaction(session_key, run_id, agent_id, self._now_ms())

    def _submit(self, batch: _Batch, agent_id: str, call: ToolCall) -> None:
        now = self._now_ms()
        batch.tools[call.id] = call.name
        verdict = self._check_loops(batch, call, now)
        if verdict is not None and verdict.blocked:
            self._answer_now(batch, call, self._loops.blocked_result(call, verdict))
            if verdict.abort_run:
                batch.abort = verdict
            return
        early = self._reject_early(call, now)
        job = self._job(batch.keys, agent_id, call, now) if early is None else None
        batch.deadlines[call.id] = job.deadline_ms if job else now
        try:
            if job is None:
                assert early is not None
                self._record_immediate(batch, early)
            else:
                self._register_and_dispatch(batch, job)
        except StoreError as exc:
            log.warning("store unavailable while submitting %s: %s", call.id, exc)
            batch.answers[call.id] = early or synthetic_result(
                call,
                SyntheticReason.DISPATCH_FAILED,
                elapsed_ms=0,
                attempt=0,
                detail=" (result store unreachable)",
            )

    def _check_loops(self, batch: _Batch, call: ToolCall, now_ms: int) -> LoopVerdict | None:
        keys = batch.keys
        try:
            pending = self._loops.before(keys.session_key, keys.run_id, batch.agent_id, call, now_ms)
        except (StoreError, redis.RedisError) as exc:
            # Detection must never make a call unanswerable: without the store, it steps aside.
            log.warning("loop check skipped for %s: %s", call.id, exc)
            return None
        if not pending.verdict.blocked:
            batch.pending_loops[call.id] = pending
        return pending.verdict

    def _record_outcomes(self, batch: _Batch) -> None:
        for call_id, pending in batch.pending_loops.items():
            result = batch.answers[call_id]
            # The warning is for the model; the outcome is hashed without it.
            batch.answers[call_id] = self._loops.with_warning(result, pending.verdict)
            try:
                abort = self._loops.after(batch.agent_id, pending, result, self._now_ms())
            except (StoreError, redis.RedisError) as exc:
                log.warning("loop outcome of %s not recorded: %s", call_id, exc)
                continue
            if abort is not None and batch.abort is None:
                batch.abort = abort

    def _answer_now(self, batch: _Batch, call: ToolCall, result: ToolResult) -> None:
        batch.tools[call.id] = call.name
        batch.deadlines[call.id] = self._now_ms()
        batch.answers[call.id] = result
        try:
            self._record_immediate(batch, result)
            batch.answers[call.id] = self._rt.ledger.results(batch.keys, [call.id]).get(call.id, result)
        except StoreError as exc:
            log.warning("store unavailable while answering %s: %s", call.id, exc)

    def _aborted_run(self, keys: RunKeys) -> RunAbort | None:
        try:
            return run_abort(self._rt.ledger, keys)
        except StoreError:
            return None

    def _abort_run(self, batch: _Batch, known: RunAbort | None, results: list[ToolResult]) -> LoopDetected:
        abort = known
        if abort is None:
            assert batch.abort is not None
            verdict = batch.abort
            detector = verdict.detector.value if verdict.detector else "loop"
            abort = RunAbort(detector, verdict.count, verdict.message)
            try:
                mark_run_aborted(self._rt.ledger, batch.keys, abort, now_ms=self._now_ms())
                self._answer_open_calls(batch.keys, abort)
            except StoreError as exc:
                log.warning("could not record the abort of run %s: %s", batch.keys.run_id, exc)
        cls = CompactionLoopPersisted if abort.detector == "compaction_loop_persisted" else LoopDetected
        error = cls(abort.detector, abort.count, abort.message)
        error.results = results
        return error

    def _answer_open_calls(self, keys: RunKeys, abort: RunAbort) -> None:
        ledger = self._rt.ledger
        for call in ledger.open_calls(keys, ledger.run_call_ids(keys)):
            result = synthetic_result(
                ToolCall(id=call.call_id, name=call.tool or "unknown"),
                SyntheticReason.RUN_ABORTED,
                elapsed_ms=self._now_ms() - call.submitted_ms,
                attempt=call.attempt,
                detail=f" by the loop detector ({abort.detector})",
            )
            ledger.finish(keys, result, now_ms=self._now_ms(), writer=self._writer)

    def _emit_event(self, event_type: str, fields: dict[str, Any]) -> None:
        try:
            with self._app.events.default_dispatcher() as dispatcher:
                dispatcher.send(event_type, **fields)
        except Exception as exc:  # noqa: BLE001 - events are best effort, never a failure path
            log.debug("could not emit %s: %s", event_type, exc)

    def _reject_early(self, call: ToolCall, now_ms: int) -> ToolResult | None:
        size = len(json.dumps(call.arguments, default=str))
        cap = self.settings.limits.max_argument_bytes
        try:
            if size > cap:
                raise InvalidArguments(call.name, [f"arguments are {size} bytes; the limit is {cap}"])
            validate_arguments(get_tool(call.name), call.arguments)
        except (ToolNotFound, InvalidArguments) as exc:
            job = CallJob(
                session_key="-",
                run_id="-",
                call=call,
                submitted_ms=now_ms,
                deadline_ms=now_ms,
                soft_s=1,
                hard_s=1,
            )
            return rejected_result(job, exc, 0)
        return None

    def _job(self, keys: RunKeys, agent_id: str, call: ToolCall, now_ms: int) -> CallJob:
        spec = get_tool(call.name)
        profile = self.settings.agents.for_agent(agent_id)
        run_deadline = ensure_run(
            self._rt.ledger,
            keys,
            now_ms=now_ms,
            deadline_ms=now_ms + int(profile.run_timeout_s * 1000),
            agent_id=agent_id,
        )
        limits = resolve_limits(
            now_ms=now_ms,
            soft_s=self.settings.tool_timeout_s(agent_id, call.name, spec.soft_timeout_s),
            declared_hard_s=spec.hard_timeout_s,
            heartbeat_s=spec.heartbeat_timeout_s,
            hard_grace_s=self.settings.limits.hard_grace_s,
            queue_allowance_s=self.settings.limits.queue_allowance_s,
            run_deadline_ms=run_deadline,
        )
        return CallJob(
            session_key=keys.session_key,
            run_id=keys.run_id,
            agent_id=agent_id,
            call=call,
            submitted_ms=now_ms,
            deadline_ms=limits.deadline_ms,
            soft_s=limits.soft_s,
            hard_s=limits.hard_s,
            heartbeat_s=limits.heartbeat_s,
        )

    def _record_immediate(self, batch: _Batch, result: ToolResult) -> None:
        now = self._now_ms()
        ledger = self._rt.ledger
        fields = {"tool": result.tool_name, "idempotent": "0", "dispatched": "1"}
        if ledger.register(batch.keys, result.tool_call_id, now_ms=now, deadline_ms=now, fields=fields):
            ledger.finish(batch.keys, result, now_ms=now, writer=self._writer)

    def _register_and_dispatch(self, batch: _Batch, job: CallJob) -> None:
        spec = get_tool(job.call.name)
        fields = {
            "tool": job.call.name,
            "agent_id": job.agent_id,
            "idempotent": "1" if spec.idempotent else "0",
            "job": job.model_dump_json(),
        }
        new = self._rt.ledger.register(
            batch.keys, job.call.id, now_ms=job.submitted_ms, deadline_ms=job.deadline_ms, fields=fields
        )
        if new:
            self._dispatch(batch.keys, job, attempt=0)

    def _dispatch(self, keys: RunKeys, job: CallJob, *, attempt: int) -> None:
        task_id = f"{keys.due_member(job.call.id)}#{attempt}"
        try:
            self._app.send_task(
                INVOKE_TASK,
                kwargs={"job": job.model_dump(mode="json")},
                task_id=task_id,
                soft_time_limit=job.soft_s,  # type: ignore[arg-type]  # floats work; stubs say int
                time_limit=job.hard_s,  # type: ignore[arg-type]
                expires=datetime.fromtimestamp(job.deadline_ms / 1000, tz=UTC),
                queue=self.settings.broker.queue,
                shadow=f"{job.call.name} [{job.session_key}/{job.run_id}]",
            )
        except Exception as exc:  # noqa: BLE001 - any broker failure means the call cannot run
            log.warning("dispatch of %s failed: %s", job.call.id, exc)
            result = synthetic_result(
                job.call,
                SyntheticReason.DISPATCH_FAILED,
                elapsed_ms=self._now_ms() - job.submitted_ms,
                attempt=0,
                detail=f" ({type(exc).__name__})",
            )
            self._rt.ledger.finish(keys, result, now_ms=self._now_ms(), writer=self._writer)
            return
        self._rt.ledger.mark_dispatched(keys, job.call.id, task_id)

    def _redispatch(self, keys: RunKeys, call_id: str) -> None:
        record = self._rt.ledger.record(keys, call_id)
        if record is None or "job" not in record.fields:
            return
        job = CallJob.model_validate_json(record.fields["job"])
        self._dispatch(keys, job, attempt=int(record.fields.get("requeues", "1")))

    # -- waiting ----------------------------------------------------------------------------

    def _wait(self, batch: _Batch, *, undispatched_after_ms: int | None = None) -> None:
        grace_ms = int(self.settings.gateway.grace_s * 1000)
        check_ms = int(self.settings.gateway.check_interval_s * 1000)
        next_check = self._now_ms() + check_ms
        while batch.waiting:
            now = self._now_ms()
            self._answer_locally_past(batch, now, grace_ms // 2)
            if not batch.waiting:
                return
            soonest = min(batch.deadlines[cid] for cid in batch.waiting) + grace_ms // 2
            timeout_ms = max(10, min(next_check - now, soonest - now))
            try:
                woke = self._rt.ledger.wait_for_done(batch.keys, timeout_ms / 1000)
                if woke or self._now_ms() >= next_check:
                    self._refresh(batch, undispatched_after_ms)
                if self._now_ms() >= next_check:
                    next_check = self._now_ms() + check_ms
            except StoreError as exc:
                log.warning("store unavailable while waiting: %s", exc)
                self._sleep(min(0.2, max(0.0, (soonest - self._now_ms()) / 1000)))

    def _refresh(self, batch: _Batch, undispatched_after_ms: int | None) -> None:
        ledger = self._rt.ledger
        now = self._now_ms()
        reap(
            ledger,
            batch.keys,
            batch.waiting,
            now_ms=now,
            min_rerun_ms=int(self.settings.lease.ttl_s * 1000),
            writer=self._writer,
            redispatch=self._redispatch,
            undispatched_after_ms=undispatched_after_ms,
        )
        batch.answers.update(ledger.results(batch.keys, batch.waiting))

    def _answer_locally_past(self, batch: _Batch, now_ms: int, margin_ms: int) -> None:
        """Last resort when the store cannot answer: never let a call go past deadline + grace."""
        for call_id in batch.waiting:
            deadline = batch.deadlines[call_id]
            if now_ms < deadline + margin_ms:
                continue
            call = ToolCall(id=call_id, name=batch.tools.get(call_id) or "unknown")
            result = synthetic_result(
                call,
                SyntheticReason.DEADLINE_EXCEEDED,
                elapsed_ms=0,
                attempt=0,
                detail=" (result store unreachable)",
            )
            try:
                self._rt.ledger.finish(batch.keys, result, now_ms=now_ms, writer=self._writer)
                stored = self._rt.ledger.results(batch.keys, [call_id])
                result = stored.get(call_id, result)
            except StoreError:
                pass
            batch.answers[call_id] = result
