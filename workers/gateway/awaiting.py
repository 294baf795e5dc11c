"""Waiting for a batch of calls on asyncio: the twin of :mod:`workers.gateway.waiting`.

Same loop, same promises (each call answered by its deadline plus the grace, from the
ledger when possible, locally when Redis is gone), but every store access is awaited on
``redis.asyncio``: a waiting batch holds a connection, never a thread, so one event loop can
wait on thousands of sessions. The only blocking step, re-publishing a lost idempotent call
through Celery, is rare and handed to ``offload``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workers.core.models import SyntheticReason, ToolResult
from workers.core.reaper import ActionKind, answer_open_call, decide
from workers.errors import StoreError
from workers.gateway.waiting import Batch, Outstanding
from workers.settings import Settings
from workers.store.aledger import AsyncLedger
from workers.store.keys import RunKeys

__all__ = ["AsyncWaiter", "Offload"]

log = logging.getLogger(__name__)

# Checks (lease, deadline, progress: three round trips) one event loop makes per second at
# most, before each batch's check interval stretches: with thousands of batches waiting, a
# fixed interval would keep the loop busy with checks and make every answer late. Deadlines
# do not depend on checks: each batch also wakes at its soonest deadline plus half the grace.
_CHECKS_PER_S = 100

Offload = Callable[..., Awaitable[Any]]
"""Runs a blocking ``function(*args)`` off the event loop: ``await offload(function, *args)``."""


@dataclass
class AsyncWaiter:
    """Awaits until every call of a batch has its one result."""

    ledger: AsyncLedger
    settings: Settings
    writer: str
    now_ms: Callable[[], int]
    redispatch: Callable[[RunKeys, str], None]
    offload: Offload
    store_later: Callable[[RunKeys, ToolResult], None] | None = None
    waiting_batches: int = 0

    async def wait(self, batch: Batch, *, undispatched_after_ms: int | None = None) -> dict[str, ToolResult]:
        """The answers to ``batch.waiting``, each by its deadline plus grace (``batch`` is only read)."""
        out = Outstanding(batch)
        self.waiting_batches += 1
        try:
            await self._wait(out, undispatched_after_ms)
        finally:
            self.waiting_batches -= 1
        return out.answers

    def _check_interval_ms(self) -> int:
        configured_ms = int(self.settings.gateway.check_interval_s * 1000)
        return max(configured_ms, self.waiting_batches * 1000 // _CHECKS_PER_S)

    async def _wait(self, out: Outstanding, undispatched_after_ms: int | None) -> None:
        batch = out.batch
        margin_ms = int(self.settings.gateway.grace_s * 1000) // 2
        check_ms = self._check_interval_ms()
        # Spread the first check: batches submitted together would otherwise check together.
        next_check = self.now_ms() + check_ms // 2 + random.randrange(check_ms // 2 + 1)
        while out.waiting:
            await self._store_fallbacks(out)
            await self._answer_locally_past(out, self.now_ms(), margin_ms)
            if not out.waiting:
                return
            soonest = min(batch.deadlines[cid] for cid in out.waiting) + margin_ms
            timeout_ms = max(10, min(next_check, soonest) - self.now_ms())
            try:
                waiting = out.waiting
                answers = await self.ledger.wait_for_results(
                    batch.keys, timeout_ms / 1000, mine=frozenset(waiting), read=waiting
                )
                if answers is not None:
                    out.learn(answers)
                if out.waiting and self.now_ms() >= next_check:
                    await self._check(out, undispatched_after_ms)
                    next_check = self.now_ms() + self._check_interval_ms()
            except StoreError as exc:
                log.warning("store unavailable while waiting: %s", exc)
                await asyncio.sleep(min(0.2, max(0.0, (soonest - self.now_ms()) / 1000)))

    async def _check(self, out: Outstanding, undispatched_after_ms: int | None) -> None:
        """Lease and deadline checks, then pick up whatever got answered."""
        batch = out.batch
        try:
            await self.ledger.touch_progress(batch.keys, self.now_ms())  # the run is visibly alive
        except StoreError as exc:
            log.warning("progress of %s/%s not recorded: %s", batch.keys.session_key, batch.keys.run_id, exc)
        await self._reap(batch.keys, out.waiting, undispatched_after_ms)
        out.learn(await self.ledger.results(batch.keys, out.waiting))

    async def _reap(self, keys: RunKeys, call_ids: Sequence[str], undispatched_after_ms: int | None) -> None:
        """:func:`workers.answering.reap`, awaited: answer lost or overdue calls, re-run idempotent ones."""
        snapshot = await self.ledger.open_calls(keys, call_ids)
        now_ms = self.now_ms()
        lease_ms = int(self.settings.lease.ttl_s * 1000)
        actions = decide(
            snapshot,
            now_ms=now_ms,
            min_rerun_ms=lease_ms,
            undispatched_after_ms=undispatched_after_ms,
            republish_after_ms=lease_ms if self.settings.gateway.republish_unclaimed else None,
        )
        by_id = {call.call_id: call for call in snapshot}
        for action in actions:
            call = by_id[action.call_id]
            if action.kind is ActionKind.REQUEUE:
                if await self.ledger.requeue(
                    keys, call.call_id, expected_attempt=call.attempt, now_ms=now_ms
                ):
                    await self.offload(self.redispatch, keys, call.call_id)
                continue
            if action.kind is ActionKind.REPUBLISH:
                if await self.ledger.count_republish(
                    keys, call.call_id, expected=call.republishes, now_ms=now_ms
                ):
                    await self.offload(self.redispatch, keys, call.call_id)
                continue
            result = answer_open_call(call, action.reason or SyntheticReason.WORKER_LOST, now_ms=now_ms)
            await self.ledger.finish(keys, result, now_ms=now_ms, writer=self.writer)

    async def _store_fallbacks(self, out: Outstanding) -> None:
        """Store answers prepared without a store, then deliver what the ledger holds."""
        batch = out.batch
        pending = [call_id for call_id in out.waiting if call_id in batch.fallbacks]
        if not pending:
            return
        try:
            for call_id in pending:
                await self.ledger.finish(
                    batch.keys, batch.fallbacks[call_id], now_ms=self.now_ms(), writer=self.writer
                )
            out.learn(await self.ledger.results(batch.keys, pending))
        except StoreError:
            pass  # still unreachable: answered locally once the margin passes

    async def _answer_locally_past(self, out: Outstanding, now_ms: int, margin_ms: int) -> None:
        """Last resort when the store cannot answer: never let a call go past deadline + grace."""
        batch = out.batch
        for prepared in out.past_margin(now_ms, margin_ms):
            call_id, result = prepared.tool_call_id, self.ledger.with_fallback(prepared)
            try:
                if not await self.ledger.finish(batch.keys, result, now_ms=now_ms, writer=self.writer):
                    # Another writer won just now: deliver what the ledger holds.
                    result = (await self.ledger.results(batch.keys, [call_id])).get(call_id, result)
            except StoreError:
                if self.store_later is not None:
                    self.store_later(batch.keys, result)
            out.answers[call_id] = result
