"""The client the agent loop uses: submit tool calls, get exactly one result per call, on time.

Whatever fails underneath — broker, workers, Redis — every call is answered no later than
its deadline plus ``gateway.grace_s``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from celery import Celery

from workers.celery_config import client_app
from workers.core.loops import LoopVerdict
from workers.core.models import SyntheticReason, ToolCall, ToolResult
from workers.core.provider_calls import ProviderAnswer, encode_results
from workers.core.reaper import OpenCall
from workers.core.results import synthetic_result
from workers.core.run_health import RunStatus
from workers.core.transcript import RepairedTranscript
from workers.errors import StoreError
from workers.gateway.agent_liveness import AgentLiveness
from workers.gateway.awaiting import AsyncWaiter
from workers.gateway.breaker_gate import BreakerGate
from workers.gateway.cancelling import Canceller
from workers.gateway.dispatching import Dispatcher
from workers.gateway.ledger_repair import repair_with_ledger
from workers.gateway.loop_abort import abort_run
from workers.gateway.loop_gate import LoopGate
from workers.gateway.persister import Persister
from workers.gateway.provider_turns import aanswer_message, answer_message
from workers.gateway.waiting import Batch, Waiter
from workers.runtime import Runtime, build_runtime, open_async_ledger, worker_id
from workers.settings import Settings, load_settings
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger
from workers.store.loop_history import RedisLoopHistory
from workers.store.runs import AgentBeats, RunAbort, open_run, run_abort
from workers.store.sessions import SessionStore
from workers.task_events import TaskEvents
from workers.tools.definitions import tool_definitions

__all__ = ["ToolGateway"]

log = logging.getLogger(__name__)

_RUN_CACHE_SIZE = 4096
_SUBMIT_THREADS = 4

T = TypeVar("T")


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
        self._app: Celery = client_app(self.settings)
        self._clock = clock
        self._sleep = sleep
        self._writer = f"{worker_id()}/gateway"
        # Answers this gateway writes (never a tool's own) close their task in Flower.
        self._task_events = TaskEvents(self._app, self._rt.ledger, role="gateway").attach()
        self._run_deadlines: dict[tuple[str, str], int] = {}
        self._dispatcher = Dispatcher(self.settings, self._rt.ledger, self._app, self._writer, self._now_ms)
        self._sessions = SessionStore(self._rt.ledger)
        self._persister = Persister(self._rt.ledger, writer=self._writer, now_ms=self._now_ms)
        self._waiter = Waiter(
            self._rt.ledger,
            self.settings,
            self._writer,
            self._now_ms,
            sleep,
            self._dispatcher.redispatch,
            on_check=self._touch_progress,
            store_later=self._persister.store_later,
        )
        self._liveness = AgentLiveness(
            AgentBeats(self._sessions), self._rt.ledger, now_ms=self._now_ms, ensure_run=self._ensure_run
        )
        # Submission for asyncio callers: short blocking steps, never a wait.
        self._pool = ThreadPoolExecutor(max_workers=_SUBMIT_THREADS, thread_name_prefix="unstuck-submit")
        self._async_waiters: dict[asyncio.AbstractEventLoop, AsyncWaiter] = {}
        history = RedisLoopHistory.on_ledger(self._rt.ledger)
        self._loops = LoopGate(self.settings, history, emit=self._emit_event)
        self._canceller = Canceller(self._rt.ledger, writer=self._writer, now_ms=self._now_ms)
        self._breakers = BreakerGate(
            self.settings.tools.breakers, self._rt.ledger, now_ms=self._now_ms, emit=self._emit_event
        )

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
        batch, aborted = self._submit_all(session_key, run_id, agent_id, calls)
        self._waiter.wait(batch)
        return self._conclude(batch, calls, aborted)

    async def acall_tools(
        self, *, session_key: str, run_id: str, agent_id: str = "main", calls: Sequence[ToolCall]
    ) -> list[ToolResult]:
        """``call_tools`` for asyncio callers: the wait holds no thread.

        Submission (short, bounded: a few store round trips and the publish per call) runs
        on the gateway's small submission pool; the wait for answers is awaited on an asyncio
        Redis client of the running loop (``await aclose()`` before that loop ends).
        Cancelling it cancels the calls (see :mod:`workers.gateway.cancelling`).
        """
        keys = self._rt.ledger.keys(session_key, run_id)
        answering = self._acall_tools(session_key, run_id, agent_id, calls)
        return await self._canceller.cancel_if_cancelled(answering, keys, [call.id for call in calls])

    async def _acall_tools(
        self, session_key: str, run_id: str, agent_id: str, calls: Sequence[ToolCall]
    ) -> list[ToolResult]:
        if self.settings.redis.cluster:
            # The asyncio listener waits on many runs' keys in one BLPOP: one node only. On a
            # cluster each waiting call holds a thread instead (asyncio's default executor).
            call = partial(self.call_tools, session_key=session_key, run_id=run_id, agent_id=agent_id)
            return await asyncio.to_thread(call, calls=calls)
        waiter = self._async_waiter()
        batch, aborted = await self._offload(self._submit_all, session_key, run_id, agent_id, calls)
        await waiter.wait(batch)
        if self._concluding_needs_store(batch, aborted):
            results: list[ToolResult] = await self._offload(self._conclude, batch, calls, aborted)
            return results
        return self._conclude(batch, calls, aborted)

    def _submit_all(
        self, session_key: str, run_id: str, agent_id: str, calls: Sequence[ToolCall]
    ) -> tuple[Batch, RunAbort | None]:
        """Open the run and submit every call (or answer it at once); the batch to wait on."""
        batch = Batch(self._rt.ledger.keys(session_key, run_id), agent_id)
        aborted = self._open_run(batch)
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
        return batch, aborted

    def _concluding_needs_store(self, batch: Batch, aborted: RunAbort | None) -> bool:
        """Whether ``_conclude`` writes to the store (loop or breaker outcomes, an abort) or only reads."""
        if aborted is not None or batch.known_abort is not None or batch.abort is not None:
            return True
        if self.settings.tools.breakers:
            return True
        return bool(batch.pending_loops) and self._loops.needs_outcomes(
            batch.agent_id, guard_armed=batch.guard_armed
        )

    def _conclude(
        self, batch: Batch, calls: Sequence[ToolCall], aborted: RunAbort | None
    ) -> list[ToolResult]:
        """Record loop outcomes; the results in call order, or the abort raised with them."""
        self._record_outcomes(batch)
        self._breakers.record(batch.keys, batch.answers)
        results = [batch.answers[call.id] for call in calls]
        known = aborted or batch.known_abort
        if known is not None or batch.abort is not None:
            raise abort_run(
                self._sessions, self._rt.ledger, batch, known, results, self._now_ms, self._writer
            )
        return results

    def cancel(self, session_key: str, run_id: str, call_id: str | None = None) -> int:
        """Cancel a call of a run, or all of them; returns how many were unanswered.

        Each is answered ``cancelled`` once: see :mod:`workers.gateway.cancelling`. Raises ``StoreError``.
        """
        return self._canceller.cancel(
            self._rt.ledger.keys(session_key, run_id), None if call_id is None else [call_id]
        )

    async def _offload(self, function: Callable[..., T], *args: Any) -> T:
        """Run a short blocking step on the submission pool, off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, function, *args)

    def _async_waiter(self) -> AsyncWaiter:
        """The async waiter of the running loop (an asyncio client belongs to one loop)."""
        loop = asyncio.get_running_loop()
        waiter = self._async_waiters.get(loop)
        if waiter is None:
            for gone in [other for other in self._async_waiters if other.is_closed()]:
                del self._async_waiters[gone]  # nothing left to close its connections on
            ledger = open_async_ledger(self.settings)
            ledger.on_answered.append(self._task_events.answered)  # as for the sync ledger
            waiter = AsyncWaiter(
                ledger,
                self.settings,
                self._writer,
                self._now_ms,
                self._dispatcher.redispatch,
                self._offload,
                store_later=self._persister.store_later,
            )
            self._async_waiters[loop] = waiter
        return waiter

    def call_tools_in(
        self,
        format: str,
        message: Any,
        *,
        session_key: str,
        run_id: str,
        agent_id: str = "main",
        turn: int | None = None,
    ) -> ProviderAnswer:
        """Run the calls of an assistant message in a provider's ``format``; the answer to append.

        Formats and shapes: ``workers.core.provider_calls``; unreadable arguments and the loop
        abort (``aborted``, not raised): ``workers.gateway.provider_turns``. For Gemini calls
        without ids pass ``turn``, the index this Content gets in ``contents``.

        Raises:
            ProviderFormatError: unknown format, or the message is not in its shape (``path``).
        """
        return answer_message(self.call_tools, format, message, session_key, run_id, agent_id, turn)

    async def acall_tools_in(
        self,
        format: str,
        message: Any,
        *,
        session_key: str,
        run_id: str,
        agent_id: str = "main",
        turn: int | None = None,
    ) -> ProviderAnswer:
        """``call_tools_in`` for asyncio callers (waits like ``acall_tools``: no thread held)."""
        return await aanswer_message(self.acall_tools, format, message, session_key, run_id, agent_id, turn)

    def results_in(self, format: str, results: Sequence[ToolResult]) -> Any:
        """What to append for ``results`` (e.g. from ``collect``) in a provider's ``format``."""
        return encode_results(format, results)

    def tool_definitions(
        self, format: str = "neutral", *, names: Sequence[str] | None = None, agent_id: str | None = None
    ) -> list[dict[str, Any]]:
        """The registered tools (or ``names``) as the provider's request takes them in ``tools``.

        With ``agent_id``, only the tools that agent may call (``tools.allow``/``deny`` and
        its own ``agents.list[].tools``).
        """
        policy = self.settings.tool_policy(agent_id) if agent_id is not None else None
        return tool_definitions(format, names=names, policy=policy)

    def collect(self, session_key: str, run_id: str) -> list[ToolResult]:
        """After a gateway restart: results of every call of the run, waiting for live ones.

        Calls that can no longer finish (never dispatched, worker lost, past deadline) get
        their synthetic result; the rest are awaited up to their deadline plus grace.
        """
        ledger = self._rt.ledger
        keys = ledger.keys(session_key, run_id)
        call_ids = ledger.run_call_ids(keys)
        batch = _collected(keys, call_ids, ledger.results(keys, call_ids), ledger.open_calls(keys, call_ids))
        self._waiter.wait(batch, undispatched_after_ms=self._undispatched_after_ms())
        return [batch.answers[cid] for cid in call_ids if cid in batch.answers]

    async def acollect(self, session_key: str, run_id: str) -> list[ToolResult]:
        """``collect`` for asyncio callers: every store access awaited, no thread held."""
        if self.settings.redis.cluster:  # as in ``_acall_tools``: a thread per waiting collect
            return await asyncio.to_thread(self.collect, session_key, run_id)
        waiter = self._async_waiter()
        ledger = waiter.ledger
        keys = ledger.keys(session_key, run_id)
        call_ids = await ledger.run_call_ids(keys)
        answers = await ledger.results(keys, call_ids)
        batch = _collected(keys, call_ids, answers, await ledger.open_calls(keys, call_ids))
        await waiter.wait(batch, undispatched_after_ms=self._undispatched_after_ms())
        return [batch.answers[cid] for cid in call_ids if cid in batch.answers]

    def _undispatched_after_ms(self) -> int:
        # A call never marked dispatched this long after submission was lost with its gateway.
        return int(self.settings.broker.publish_timeout_s * 3000)

    def end_run(self, session_key: str, run_id: str, status: RunStatus | str = RunStatus.COMPLETED) -> bool:
        """Mark a run finished and free its session's lane; False if it had ended already.

        ``status`` is a :class:`RunStatus` (``COMPLETED``, ``ABORTED`` or ``TIMED_OUT``) or its
        value. Calls of an ended run are refused (answered ``run_aborted``) from then on.

        Raises:
            ValueError: when ``status`` is no run status.
        """
        self._run_deadlines.pop((session_key, run_id), None)
        self._liveness.forget(self._rt.ledger.keys(session_key, run_id))  # the next beat must ask
        return self._sessions.end_run(session_key, run_id, RunStatus(status), self._now_ms())

    def heartbeat(
        self, session_key: str, run_id: str, *, agent_id: str = "main", what: str = "model"
    ) -> bool:
        """Tell the watchdog the agent works on this run (its model is thinking or streaming).

        Call it as often as you like (at most one store write per second per run); the idle
        guards call it on every chunk when given the gateway. Creates the run on first use.
        Returns False once the run ended or was superseded (stop working on it).
        """
        return self._liveness.heartbeat(
            self._rt.ledger.keys(session_key, run_id), agent_id=agent_id, what=what
        )

    def note_stream_idle(self, session_key: str, run_id: str, *, idle_timeout_s: float) -> None:
        """Record on the run that a model stream went idle past ``idle_timeout_s`` (the idle guards do)."""
        self._liveness.stream_idle(self._rt.ledger.keys(session_key, run_id), idle_timeout_s=idle_timeout_s)

    def _ensure_run(self, keys: RunKeys, agent_id: str) -> None:
        self._open_run(Batch(keys, agent_id))

    def _touch_progress(self, keys: RunKeys) -> None:
        try:
            self._sessions.touch_progress(keys.session_key, keys.run_id, self._now_ms())
        except StoreError as exc:
            log.warning("progress of %s/%s not recorded: %s", keys.session_key, keys.run_id, exc)

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

    def watch_answers(self, ledger: Ledger) -> None:
        """Also close in Flower the tasks of calls answered through ``ledger`` (a door's own client)."""
        ledger.on_answered.append(self._task_events.answered)

    def close(self) -> None:
        """Release connections (after up to 1 s to send the last answers' events to Flower).

        Asyncio callers: ``await aclose()`` instead, on the loop they called from.
        """
        self._task_events.close(timeout_s=1.0)
        self._pool.shutdown(wait=False)
        self._rt.ledger.close()

    async def aclose(self) -> None:
        """Release connections, those of the running loop's asyncio client included."""
        waiter = self._async_waiters.pop(asyncio.get_running_loop(), None)
        if waiter is not None:
            await waiter.ledger.aclose()
        self.close()

    # -- submission -------------------------------------------------------------------------

    def note_compaction(self, session_key: str, run_id: str, agent_id: str = "main") -> bool:
        """Arm the post-compaction guard after the agent compacted its context.

        Returns whether the guard is enabled for the agent.
        """
        return self._loops.note_compaction(session_key, run_id, agent_id, self._now_ms())

    def _submit(self, batch: Batch, agent_id: str, call: ToolCall) -> None:
        now = self._now_ms()
        batch.tools[call.id] = call.name
        verdict = self._check_loops(batch, call, now)
        if verdict is not None and verdict.blocked:
            self._answer_now(batch, call, self._loops.blocked_result(call, verdict))
            if verdict.abort_run:
                batch.abort = verdict
            return
        early = self._dispatcher.reject_early(call, agent_id) or self._breakers.admit(batch.keys, call)
        if early is not None:
            self._answer_now(batch, call, early)
            return
        job = self._dispatcher.job(batch.keys, agent_id, call, now, batch.run_deadline_ms)
        batch.deadlines[call.id] = job.deadline_ms
        batch.submitted[call.id] = job.submitted_ms
        try:
            warning = self._loops.warning_of(verdict)
            registration = self._dispatcher.register_and_dispatch(batch.keys, job, loop_warning=warning)
            batch.guard_armed = batch.guard_armed or registration.guard_armed
            if registration.refused:
                self._refuse(batch, call, registration.run_status)
        except StoreError as exc:
            log.warning("store unavailable while submitting %s: %s", call.id, exc)
            # Stored by the waiter as soon as Redis answers (then the ledger's answer is
            # delivered), else handed over once the grace margin passes and stored later.
            batch.deadlines[call.id] = now
            batch.fallbacks[call.id] = synthetic_result(
                call,
                SyntheticReason.DISPATCH_FAILED,
                elapsed_ms=0,
                attempt=0,
                detail=" (result store unreachable)",
            )

    def _check_loops(self, batch: Batch, call: ToolCall, now_ms: int) -> LoopVerdict | None:
        keys = batch.keys
        try:
            pending = self._loops.before(keys.session_key, keys.run_id, batch.agent_id, call, now_ms)
        except StoreError as exc:
            # Detection must never make a call unanswerable: without the store, it steps aside.
            log.warning("loop check skipped for %s: %s", call.id, exc)
            return None
        if not pending.verdict.blocked:
            batch.pending_loops[call.id] = pending
        return pending.verdict

    def _record_outcomes(self, batch: Batch) -> None:
        if not self._loops.needs_outcomes(batch.agent_id, guard_armed=batch.guard_armed):
            return  # detection off and no compaction guard armed: nothing to record
        for call_id, pending in batch.pending_loops.items():
            result = batch.answers[call_id]
            # The warning is for the model; the outcome is hashed without it.
            batch.answers[call_id] = self._loops.with_warning(result, pending.verdict)
            try:
                abort = self._loops.after(batch.agent_id, pending, result, self._now_ms())
            except StoreError as exc:
                log.warning("loop outcome of %s not recorded: %s", call_id, exc)
                continue
            if abort is not None and batch.abort is None:
                batch.abort = abort

    def _answer_now(self, batch: Batch, call: ToolCall, result: ToolResult) -> None:
        result = self._rt.ledger.with_fallback(result)  # what the ledger stores (circuit_open)
        batch.tools[call.id] = call.name
        batch.deadlines[call.id] = self._now_ms()
        try:
            registration = self._dispatcher.record_immediate(batch.keys, result)
            batch.guard_armed = batch.guard_armed or registration.guard_armed
            if registration.refused and result.reason != SyntheticReason.RUN_ABORTED.value:
                # The run ended (a loop abort, a timeout, a newer run): that answer wins.
                self._refuse(batch, call, registration.run_status)
            elif registration.created:
                batch.answers[call.id] = result
            else:
                # A resubmitted call id: the stored answer is the one that counts.
                batch.answers[call.id] = self._rt.ledger.results(batch.keys, [call.id]).get(call.id, result)
        except StoreError as exc:
            log.warning("store unavailable while answering %s: %s", call.id, exc)
            batch.fallbacks[call.id] = result  # answered by the waiter, stored first if it can

    def _open_run(self, batch: Batch) -> RunAbort | None:
        """Create or read the run record: one round trip the first time this gateway sees a run.

        The deadline never changes once set, so it is cached; later aborts and an armed
        compaction guard are reported by each call's registration instead.
        """
        run = (batch.keys.session_key, batch.keys.run_id)
        if run in self._run_deadlines:
            batch.run_deadline_ms = self._run_deadlines[run]
            return None
        now = self._now_ms()
        run_timeout_s = self.settings.agents.for_agent(batch.agent_id).run_timeout_s
        try:
            # Take the session's lane (superseding an older run of the session); a run that
            # already ended gets token 0, and its calls are then refused at registration.
            self._sessions.begin_run(
                *run, batch.agent_id, now, now + int(run_timeout_s * 1000), writer=self._writer
            )
            state = open_run(
                self._rt.ledger,
                batch.keys,
                now_ms=now,
                deadline_ms=now + int(run_timeout_s * 1000),
                agent_id=batch.agent_id,
            )
        except StoreError as exc:
            log.warning("run record unavailable: %s", exc)
            return None
        batch.run_deadline_ms = state.deadline_ms
        batch.guard_armed = state.guard_armed
        if state.abort is None:
            if len(self._run_deadlines) >= _RUN_CACHE_SIZE:
                self._run_deadlines.pop(next(iter(self._run_deadlines)))
            self._run_deadlines[run] = state.deadline_ms
        return state.abort

    def _refuse(self, batch: Batch, call: ToolCall, run_status: RunStatus) -> None:
        """Answer a call its run no longer accepts; a loop abort is raised to the caller later."""
        self._run_deadlines.pop((batch.keys.session_key, batch.keys.run_id), None)
        try:
            abort = run_abort(self._rt.ledger, batch.keys)
        except StoreError:
            abort = None
        batch.known_abort = batch.known_abort or abort
        detail = f" by the loop detector ({abort.detector})" if abort else f" (run {run_status})"
        result = synthetic_result(call, SyntheticReason.RUN_ABORTED, elapsed_ms=0, attempt=0, detail=detail)
        self._answer_now(batch, call, result)

    def _emit_event(self, event_type: str, fields: dict[str, Any]) -> None:
        self._rt.ledger.publish_event(event_type.removeprefix("unstuck-"), **fields)
        try:
            with self._app.events.default_dispatcher() as dispatcher:
                dispatcher.send(event_type, **fields)
        except Exception as exc:  # noqa: BLE001 - events are best effort, never a failure path
            log.debug("could not emit %s: %s", event_type, exc)


def _collected(
    keys: RunKeys, call_ids: Sequence[str], answers: dict[str, ToolResult], open_calls: Sequence[OpenCall]
) -> Batch:
    """The batch ``collect`` waits on: every call of the run, answered or still open."""
    batch = Batch(keys)
    batch.answers.update(answers)
    for call in open_calls:
        batch.deadlines[call.call_id] = call.deadline_ms
        batch.submitted[call.call_id] = call.submitted_ms
        batch.tools[call.call_id] = call.tool
    for call_id in call_ids:
        batch.deadlines.setdefault(call_id, 0)
    return batch
