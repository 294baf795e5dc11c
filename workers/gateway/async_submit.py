"""Submission on the event loop: register and publish a batch's calls with no thread hop.

The asyncio driver of :class:`workers.gateway.call_path.CallPath`'s stages. A batch whose
earlier stages need no store (no loop detection, no circuit breakers, no call refused at
admission: :meth:`CallPath.storeless_until_registration`) passes them on the loop (the first
call of a run opens it on the submission pool: two round trips); each call is then registered
through the asyncio ledger by :mod:`workers.gateway._async.registering` (the source the sync
path's registration is generated from), whose register script pushes its message onto the
broker's Redis list in the same step (:mod:`workers.celery_edge.messages`), its ``task-sent``
event left to the gateway's event thread. Anything else (loop detection, breakers, a refusal,
an aborted run, a signed or non-Redis broker) takes the sync path on the submission pool. The
guarantees are the same either way: first writer wins, and a call is registered with its
message or not at all (a store failure leaves it unsubmitted, answered as a call the store
did not take).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from workers.core.models import ToolCall
from workers.gateway._async.registering import AsyncRegistering
from workers.gateway.batch import Batch
from workers.gateway.call_path import CallPath
from workers.gateway.dispatching import Dispatcher
from workers.store.keys import RunKeys
from workers.store.ledger import AsyncLedger

__all__ = ["AsyncSubmitter"]

Offload = Callable[..., Awaitable[Any]]


class AsyncSubmitter:
    """Submits batches for one event loop (see the module docstring)."""

    def __init__(
        self,
        path: CallPath,
        dispatcher: Dispatcher,
        ledger: AsyncLedger,
        offload: Offload,
        *,
        writer: str,
        now_ms: Callable[[], int],
    ) -> None:
        self._path = path
        self._dispatcher = dispatcher
        self._offload = offload
        self._registering = AsyncRegistering(path, dispatcher, ledger, offload)
        self._writer = writer
        self._now_ms = now_ms
        # Batches submitted on the loop at once, one per connection of the ledger's registering
        # client, so a registration never waits for a connection; the others wait their turn
        # before their first stage (their deadlines start there).
        self._turns = asyncio.Semaphore(ledger.registering_slots)
        self._submitting: set[asyncio.Future[Batch]] = set()

    async def submit_all(self, keys: RunKeys, agent_id: str, calls: Sequence[ToolCall]) -> Batch:
        """:meth:`CallPath.submit_all`, on the loop when it can be (see the module docstring).

        Cancelling the caller does not stop a submission under way, as it did not stop the
        thread this replaces: the canceller marks the calls and cancels those registered
        after its mark (:mod:`workers.gateway.cancel`).
        """
        submitting = asyncio.ensure_future(self._submit(keys, agent_id, calls))
        self._submitting.add(submitting)  # a strong reference while it outlives its caller
        submitting.add_done_callback(self._submitting.discard)
        return await asyncio.shield(submitting)

    async def _submit(self, keys: RunKeys, agent_id: str, calls: Sequence[ToolCall]) -> Batch:
        path = self._path
        if self._dispatcher.messages is None or not path.storeless_until_registration(agent_id, calls):
            result: Batch = await self._offload(path.submit_all, keys, agent_id, calls)
            return result
        async with self._turns:
            return await self._submit_on_loop(keys, agent_id, calls)

    async def _submit_on_loop(self, keys: RunKeys, agent_id: str, calls: Sequence[ToolCall]) -> Batch:
        path = self._path
        batch = Batch(keys, agent_id)
        if not path.open_cached_run(batch):
            await self._offload(path.open_run, batch)  # the first call of a run: two round trips
            if batch.abort is not None:  # refused at once, through the store: the sync stages
                await self._offload(self._submit_each, batch, calls)
                return batch
        for call in calls:
            batch.registered_last = None  # as CallPath.submit: only the batch's last call counts
            # Validated in _submit (storeless_until_registration): admission does not again.
            in_flight = path.reaches_registration(batch, call, validated=True)
            if in_flight is not None:
                await self._registering.register(batch, in_flight)
        return batch

    def _submit_each(self, batch: Batch, calls: Sequence[ToolCall]) -> None:
        for call in calls:
            self._path.submit(batch, call)
