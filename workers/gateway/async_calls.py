"""The asyncio half of :class:`workers.gateway.client.ToolGateway`: the same call path, awaited.

Submission runs on the event loop when it can (:mod:`workers.gateway.async_submit`: each
call registered through the asyncio ledger and its message pushed onto a Redis broker's list)
and otherwise on the gateway's small submission pool (loop detection, breakers, a signed or
non-Redis broker, the first call of a run); the wait for answers is awaited on an asyncio
Redis client of the running loop, so a waiting batch holds a connection, never a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from celery import Celery

from workers import tracing
from workers.celery_edge.task_events import TaskEvents
from workers.core.models import ToolCall, ToolResult
from workers.core.provider_calls import ProviderAnswer
from workers.gateway.async_submit import AsyncSubmitter
from workers.gateway.awaiting import AsyncWaiter
from workers.gateway.call_path import CallPath
from workers.gateway.cancelling import Canceller
from workers.gateway.dispatching import Dispatcher
from workers.gateway.persister import Persister
from workers.gateway.provider_turns import aanswer_message
from workers.gateway.waiting import Batch
from workers.runtime import Runtime, open_async_ledger
from workers.settings import Settings
from workers.store.keys import RunKeys

__all__ = ["AsyncCalls"]

_SUBMIT_THREADS = 4

T = TypeVar("T")


class AsyncCalls:
    """``acall_tools``, ``acall_tools_in``, ``acollect`` and ``aclose`` of the gateway."""

    # Set by the gateway's constructor (see ``ToolGateway.__init__``).
    settings: Settings
    _rt: Runtime
    _writer: str
    _task_events: TaskEvents
    _app: Celery
    _dispatcher: Dispatcher
    _persister: Persister
    _canceller: Canceller
    _path: CallPath
    call_tools: Callable[..., list[ToolResult]]
    collect: Callable[[str, str], list[ToolResult]]
    close: Callable[[], None]
    _now_ms: Callable[[], int]
    _undispatched_after_ms: Callable[[], int]

    def _init_async(self) -> None:
        # Submission for asyncio callers: short blocking steps, never a wait.
        self._pool = ThreadPoolExecutor(max_workers=_SUBMIT_THREADS, thread_name_prefix="unstuck-submit")
        self._async_waiters: dict[asyncio.AbstractEventLoop, AsyncWaiter] = {}
        self._async_submitters: dict[asyncio.AbstractEventLoop, AsyncSubmitter] = {}

    async def acall_tools(
        self, *, session_key: str, run_id: str, agent_id: str = "main", calls: Sequence[ToolCall]
    ) -> list[ToolResult]:
        """``call_tools`` for asyncio callers: the wait holds no thread.

        Submission runs on the loop when it can, else on the gateway's small submission pool
        (see the module docstring); the wait for answers is awaited on an asyncio Redis
        client of the running loop (``await aclose()`` before that loop ends).
        Cancelling it cancels the calls (see :mod:`workers.gateway.cancelling`).
        """
        keys = self._rt.ledger.keys(session_key, run_id)
        with tracing.CallSpans(session_key, run_id, agent_id, calls) as spans:
            answering = self._acall_tools(keys, agent_id, calls)
            return spans.end(
                await self._canceller.cancel_if_cancelled(answering, keys, [c.id for c in calls])
            )

    async def _acall_tools(self, keys: RunKeys, agent_id: str, calls: Sequence[ToolCall]) -> list[ToolResult]:
        if self.settings.redis.cluster:
            # The asyncio listener waits on many runs' keys in one BLPOP: one node only. On a
            # cluster each waiting call holds a thread instead (asyncio's default executor).
            call = partial(
                self.call_tools, session_key=keys.session_key, run_id=keys.run_id, agent_id=agent_id
            )
            return await asyncio.to_thread(call, calls=calls)
        waiter = self._async_waiter()
        batch = await self._async_submitters[asyncio.get_running_loop()].submit_all(keys, agent_id, calls)
        batch.answers.update(await waiter.wait(batch))
        if self._path.needs_store(batch):
            results: list[ToolResult] = await self._offload(self._path.conclude, batch, calls)
            return results
        return self._path.conclude(batch, calls)

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

    async def acollect(self, session_key: str, run_id: str) -> list[ToolResult]:
        """``collect`` for asyncio callers: every store access awaited, no thread held."""
        if self.settings.redis.cluster:  # as in ``_acall_tools``: a thread per waiting collect
            return await asyncio.to_thread(self.collect, session_key, run_id)
        waiter = self._async_waiter()
        ledger = waiter.ledger
        keys = ledger.keys(session_key, run_id)
        call_ids = await ledger.run_call_ids(keys)
        answers = await ledger.results(keys, call_ids)
        batch = Batch.collected(keys, call_ids, answers, await ledger.open_calls(keys, call_ids))
        batch.answers.update(await waiter.wait(batch, undispatched_after_ms=self._undispatched_after_ms()))
        # No link to each call's own span: reading the records would block the loop.
        return tracing.collected(
            None, session_key, run_id, [batch.answers[c] for c in call_ids if c in batch.answers]
        )

    async def aclose(self) -> None:
        """Release connections, those of the running loop's asyncio client included."""
        loop = asyncio.get_running_loop()
        self._async_submitters.pop(loop, None)
        waiter = self._async_waiters.pop(loop, None)
        if waiter is not None:
            await waiter.ledger.aclose()
        self.close()

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
                self._async_submitters.pop(gone, None)
            ledger = open_async_ledger(self.settings)
            ledger.on_answered.append(self._task_events.answered)  # as for the sync ledger
            ledger.on_answered.append(tracing.answer_spans("gateway", None))
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
            self._async_submitters[loop] = AsyncSubmitter(
                self._path,
                self._dispatcher,
                ledger,
                self._offload,
                writer=self._writer,
                now_ms=self._now_ms,
            )
        return waiter
