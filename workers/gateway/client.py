"""The client the agent loop uses: submit tool calls, get exactly one result per call, on time.

Whatever fails underneath — broker, workers, Redis — every call is answered no later than
its deadline plus ``gateway.grace_s``. A call's path (its stages, in order) is
:mod:`workers.gateway.call_path`; the asyncio methods are :mod:`workers.gateway.async_calls`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from celery import Celery

from workers import tracing
from workers.celery_edge.app_config import client_app
from workers.celery_edge.task_events import TaskEvents
from workers.core.models import ToolCall, ToolResult
from workers.core.provider_calls import ProviderAnswer, encode_results
from workers.core.run_health import RunStatus
from workers.core.transcript import RepairedTranscript
from workers.gateway._sync import turns
from workers.gateway._sync.waiter import Waiter
from workers.gateway.agent_liveness import AgentLiveness
from workers.gateway.async_calls import AsyncCalls, SyncParts
from workers.gateway.breaker import BreakerGate
from workers.gateway.call_path import CallPath
from workers.gateway.cancel import Canceller
from workers.gateway.deferred_answers import Persister
from workers.gateway.dispatching import Dispatcher
from workers.gateway.ledger_repair import repair_with_ledger
from workers.gateway.loop_gate import LoopGate
from workers.runtime import Runtime, build_runtime, worker_id
from workers.settings import Settings, load_settings
from workers.store.ledger import Ledger
from workers.store.loop_history import RedisLoopHistory
from workers.store.sessions import AgentBeats, SessionStore
from workers.tools.definitions import tool_definitions

__all__ = ["ToolGateway"]

log = logging.getLogger(__name__)


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
        self._writer = f"{worker_id()}/gateway"
        # Answers this gateway writes (never a tool's own) close their task in Flower; each
        # dispatched call's task-sent goes the same batched way.
        self._task_events = TaskEvents(
            self._app, self._rt.ledger, role="gateway", flush_ms=self.settings.broker.task_events_flush_ms
        ).attach()
        tracing.watch_answers(self._rt.ledger, "gateway")
        self._dispatcher = Dispatcher(
            self.settings,
            self._rt.ledger,
            self._app,
            self._writer,
            self._now_ms,
            on_sent=self._task_events.sent,
        )
        self._sessions = SessionStore(self._rt.ledger)
        answers = self._dispatcher.answers
        self._persister = Persister(self._rt.ledger, answers=answers, now_ms=self._now_ms)
        self._waiter = Waiter(
            self._rt.ledger,
            self.settings,
            self._writer,
            self._now_ms,
            sleep,
            self._dispatcher.redispatch,
            store_later=self._persister.store_later,
        )
        history = RedisLoopHistory.on_ledger(self._rt.ledger)
        self._loops = LoopGate(self.settings, history, emit=self._emit_event)
        self._canceller = Canceller(self._rt.ledger, answers=answers, now_ms=self._now_ms)
        # Without breakers configured the gate would only say "admitted": the path skips it.
        breakers = (
            BreakerGate(
                self.settings.tools.breakers, self._rt.ledger, now_ms=self._now_ms, emit=self._emit_event
            )
            if self.settings.tools.breakers
            else None
        )
        self._path = CallPath(
            self.settings,
            self._rt.ledger,
            self._sessions,
            self._dispatcher,
            self._loops,
            breakers,
            writer=self._writer,
            now_ms=self._now_ms,
        )
        self._liveness = AgentLiveness(
            AgentBeats(self._sessions), self._rt.ledger, now_ms=self._now_ms, ensure_run=self._path.ensure_run
        )
        self._async = AsyncCalls(
            SyncParts(
                settings=self.settings,
                ledger=self._rt.ledger,
                writer=self._writer,
                task_events=self._task_events,
                dispatcher=self._dispatcher,
                persister=self._persister,
                canceller=self._canceller,
                path=self._path,
                call_tools=self.call_tools,
                collect=self.collect,
                now_ms=self._now_ms,
                undispatched_after_ms=self._undispatched_after_ms(),
            )
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
        with tracing.CallSpans(session_key, run_id, agent_id, calls) as spans:
            batch = self._path.submit_all(self._rt.ledger.keys(session_key, run_id), agent_id, calls)
            batch.answers.update(self._waiter.wait(batch))
            return spans.end(self._path.conclude(batch, calls))

    async def acall_tools(
        self, *, session_key: str, run_id: str, agent_id: str = "main", calls: Sequence[ToolCall]
    ) -> list[ToolResult]:
        """``call_tools`` for asyncio callers: the wait holds no thread.

        Submission runs on the loop when it can, else on the gateway's small submission pool
        (see :mod:`workers.gateway.async_calls`); the wait for answers is awaited on an asyncio
        Redis client of the running loop (``await aclose()`` before that loop ends).
        Cancelling it cancels the calls (see :mod:`workers.gateway.cancel`).
        """
        return await self._async.call_tools(
            session_key=session_key, run_id=run_id, agent_id=agent_id, calls=calls
        )

    def cancel(self, session_key: str, run_id: str, call_id: str | None = None) -> int:
        """Cancel a call of a run, or all of them; returns how many were unanswered.

        Each is answered ``cancelled`` once: see :mod:`workers.gateway.cancel`. Raises ``StoreError``.
        """
        return self._canceller.cancel(
            self._rt.ledger.keys(session_key, run_id), None if call_id is None else [call_id]
        )

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
        abort (``aborted``, not raised): its ``ProviderTurn``. For Gemini calls without ids
        pass ``turn``, the index this Content gets in ``contents``.

        Raises:
            ProviderFormatError: unknown format, or the message is not in its shape (``path``).
        """
        return turns.call_tools_in(
            self.call_tools,
            format,
            message,
            session_key=session_key,
            run_id=run_id,
            agent_id=agent_id,
            turn=turn,
        )

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
        return await self._async.call_tools_in(
            format, message, session_key=session_key, run_id=run_id, agent_id=agent_id, turn=turn
        )

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
        return turns.collect(
            self._waiter,
            session_key,
            run_id,
            undispatched_after_ms=self._undispatched_after_ms(),
            reader=tracing.ledger_reader(self._rt.ledger),
        )

    async def acollect(self, session_key: str, run_id: str) -> list[ToolResult]:
        """``collect`` for asyncio callers: every store access awaited, no thread held."""
        return await self._async.collect(session_key, run_id)

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
        keys = self._rt.ledger.keys(session_key, run_id)
        self._path.forget_run(keys)
        self._liveness.forget(keys)  # the next beat must ask
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
        self._async.pool.shutdown(wait=False)
        self._persister.stop()
        self._rt.ledger.close()

    async def aclose(self) -> None:
        """Release connections, those of the running loop's asyncio client included."""
        await self._async.close()
        self.close()

    # -- loops and events ---------------------------------------------------------------------

    def note_compaction(self, session_key: str, run_id: str, agent_id: str = "main") -> bool:
        """Arm the post-compaction guard after the agent compacted its context.

        Returns whether the guard is enabled for the agent.
        """
        return self._loops.note_compaction(session_key, run_id, agent_id, self._now_ms())

    def _emit_event(self, event_type: str, fields: dict[str, Any]) -> None:
        self._rt.ledger.publish_event(event_type.removeprefix("unstuck-"), **fields)
        try:
            with self._app.events.default_dispatcher() as dispatcher:
                dispatcher.send(event_type, **fields)
        except Exception as exc:  # noqa: BLE001 - events are best effort, never a failure path
            log.debug("could not emit %s: %s", event_type, exc)
