"""The asyncio half of :class:`workers.gateway.client.ToolGateway`: the same call path, awaited.

Submission runs on the event loop when it can (:mod:`workers.gateway.async_submit`: each
call registered through the asyncio ledger and its message pushed onto a Redis broker's list)
and otherwise on the gateway's small submission pool (loop detection, breakers, a signed or
non-Redis broker, the first call of a run); the wait for answers is awaited on an asyncio
Redis client of the running loop, so a waiting batch holds a connection, never a thread.

The gateway holds one :class:`AsyncCalls` beside its sync parts (composition: what it shares
with them is handed over at construction in :class:`SyncParts`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from workers import tracing
from workers.celery_edge.task_events import TaskEvents
from workers.core.models import ToolCall, ToolResult
from workers.core.provider_calls import ProviderAnswer
from workers.gateway._async import turns
from workers.gateway._async.waiter import AsyncWaiter
from workers.gateway.async_submit import AsyncSubmitter
from workers.gateway.call_path import CallPath
from workers.gateway.cancel import Canceller
from workers.gateway.deferred_answers import Persister
from workers.gateway.dispatching import Dispatcher
from workers.runtime import open_async_ledger
from workers.settings import Settings
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger

__all__ = ["AsyncCalls", "SyncParts"]

_SUBMIT_THREADS = 4

T = TypeVar("T")


@dataclass(frozen=True)
class SyncParts:
    """What the asyncio calls share with the gateway's sync ones."""

    settings: Settings
    ledger: Ledger
    writer: str
    task_events: TaskEvents
    dispatcher: Dispatcher
    persister: Persister
    canceller: Canceller
    path: CallPath
    call_tools: Callable[..., list[ToolResult]]
    collect: Callable[[str, str], list[ToolResult]]
    now_ms: Callable[[], int]
    undispatched_after_ms: int


class AsyncCalls:
    """``acall_tools``, ``acall_tools_in``, ``acollect`` and ``aclose`` of the gateway."""

    def __init__(self, parts: SyncParts) -> None:
        self._parts = parts
        # Submission for asyncio callers: short blocking steps, never a wait.
        self.pool = ThreadPoolExecutor(max_workers=_SUBMIT_THREADS, thread_name_prefix="unstuck-submit")
        self._waiters: dict[asyncio.AbstractEventLoop, AsyncWaiter] = {}
        self._submitters: dict[asyncio.AbstractEventLoop, AsyncSubmitter] = {}

    async def call_tools(
        self, *, session_key: str, run_id: str, agent_id: str = "main", calls: Sequence[ToolCall]
    ) -> list[ToolResult]:
        """``ToolGateway.acall_tools``; cancelling it cancels the calls."""
        keys = self._parts.ledger.keys(session_key, run_id)
        with tracing.CallSpans(session_key, run_id, agent_id, calls) as spans:
            answering = self._call_tools(keys, agent_id, calls)
            cancelling = self._parts.canceller.cancel_if_cancelled(answering, keys, [c.id for c in calls])
            return spans.end(await cancelling)

    async def _call_tools(self, keys: RunKeys, agent_id: str, calls: Sequence[ToolCall]) -> list[ToolResult]:
        parts = self._parts
        if parts.settings.redis.cluster:
            # The asyncio listener waits on many runs' keys in one BLPOP: one node only. On a
            # cluster each waiting call holds a thread instead (asyncio's default executor).
            call = partial(
                parts.call_tools, session_key=keys.session_key, run_id=keys.run_id, agent_id=agent_id
            )
            return await asyncio.to_thread(call, calls=calls)
        waiter = self._waiter()
        batch = await self._submitters[asyncio.get_running_loop()].submit_all(keys, agent_id, calls)
        batch.answers.update(await waiter.wait(batch))
        if parts.path.needs_store(batch):
            results: list[ToolResult] = await self._offload(parts.path.conclude, batch, calls)
            return results
        return parts.path.conclude(batch, calls)

    async def call_tools_in(
        self,
        format: str,
        message: Any,
        *,
        session_key: str,
        run_id: str,
        agent_id: str = "main",
        turn: int | None = None,
    ) -> ProviderAnswer:
        """``ToolGateway.acall_tools_in``: the sync driver's steps, the calls awaited."""
        return await turns.call_tools_in(
            self.call_tools,
            format,
            message,
            session_key=session_key,
            run_id=run_id,
            agent_id=agent_id,
            turn=turn,
        )

    async def collect(self, session_key: str, run_id: str) -> list[ToolResult]:
        """``ToolGateway.acollect``: every store access awaited, no thread held."""
        parts = self._parts
        if parts.settings.redis.cluster:  # as in ``_call_tools``: a thread per waiting collect
            return await asyncio.to_thread(parts.collect, session_key, run_id)
        # No link to each call's own span (reader None): reading the records would block the loop.
        return await turns.collect(
            self._waiter(),
            session_key,
            run_id,
            undispatched_after_ms=parts.undispatched_after_ms,
            reader=None,
        )

    async def close(self) -> None:
        """Release the running loop's asyncio client (the gateway then closes the rest)."""
        loop = asyncio.get_running_loop()
        self._submitters.pop(loop, None)
        waiter = self._waiters.pop(loop, None)
        if waiter is not None:
            await waiter.ledger.aclose()

    async def _offload(self, function: Callable[..., T], *args: Any) -> T:
        """Run a short blocking step on the submission pool, off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, function, *args)

    def _waiter(self) -> AsyncWaiter:
        """The async waiter of the running loop (an asyncio client belongs to one loop)."""
        loop = asyncio.get_running_loop()
        waiter = self._waiters.get(loop)
        if waiter is None:
            for gone in [other for other in self._waiters if other.is_closed()]:
                del self._waiters[gone]  # nothing left to close its connections on
                self._submitters.pop(gone, None)
            parts = self._parts
            ledger = open_async_ledger(parts.settings)
            ledger.on_answered.append(parts.task_events.answered)  # as for the sync ledger
            ledger.on_answered.append(tracing.answer_spans("gateway", None))
            waiter = AsyncWaiter(
                ledger,
                parts.settings,
                parts.writer,
                parts.now_ms,
                asyncio.sleep,
                partial(self._offload, parts.dispatcher.redispatch),  # it publishes through Celery
                store_later=parts.persister.store_later,
            )
            self._waiters[loop] = waiter
            self._submitters[loop] = AsyncSubmitter(
                parts.path, parts.dispatcher, ledger, self._offload, writer=parts.writer, now_ms=parts.now_ms
            )
        return waiter
