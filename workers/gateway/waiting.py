"""Waiting for a batch of calls: wake on answers, check leases and deadlines, never overrun.

The gateway hands a :class:`Batch` to :class:`Waiter`; every call in it is answered no later
than its deadline plus the grace, from the ledger when possible and locally when Redis is
gone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from workers.answering import reap
from workers.core.loops import LoopVerdict, PendingCall
from workers.core.models import ToolCall, ToolResult
from workers.core.results import deadline_result
from workers.errors import StoreError
from workers.settings import Settings
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger
from workers.store.runs import RunAbort

__all__ = ["Batch", "Waiter"]

log = logging.getLogger(__name__)


@dataclass
class Batch:
    """Calls of one run being waited for: call id -> deadline (ms), plus answers so far."""

    keys: RunKeys
    agent_id: str = "main"
    deadlines: dict[str, int] = field(default_factory=dict)
    pending_loops: dict[str, PendingCall] = field(default_factory=dict)
    abort: LoopVerdict | None = None
    known_abort: RunAbort | None = None
    run_deadline_ms: int | None = None
    guard_armed: bool = False
    tools: dict[str, str] = field(default_factory=dict)
    submitted: dict[str, int] = field(default_factory=dict)
    answers: dict[str, ToolResult] = field(default_factory=dict)
    # Answers prepared while the store was unreachable: stored (first writer wins) as soon as
    # it answers, and what the ledger then holds is delivered.
    fallbacks: dict[str, ToolResult] = field(default_factory=dict)

    @property
    def waiting(self) -> list[str]:
        """Call ids still without an answer."""
        return [cid for cid in self.deadlines if cid not in self.answers]


@dataclass
class Waiter:
    """Blocks until every call of a batch has its one result."""

    ledger: Ledger
    settings: Settings
    writer: str
    now_ms: Callable[[], int]
    sleep: Callable[[float], None]
    redispatch: Callable[[RunKeys, str], None]
    on_check: Callable[[RunKeys], None] | None = None
    store_later: Callable[[RunKeys, ToolResult], None] | None = None

    def wait(self, batch: Batch, *, undispatched_after_ms: int | None = None) -> None:
        """Return once ``batch.waiting`` is empty; each call by its deadline plus grace."""
        margin_ms = int(self.settings.gateway.grace_s * 1000) // 2
        check_ms = int(self.settings.gateway.check_interval_s * 1000)
        next_check = self.now_ms() + check_ms
        while batch.waiting:
            self._store_fallbacks(batch)
            self._answer_locally_past(batch, self.now_ms(), margin_ms)
            if not batch.waiting:
                return
            soonest = min(batch.deadlines[cid] for cid in batch.waiting) + margin_ms
            timeout_ms = max(10, min(next_check, soonest) - self.now_ms())
            try:
                if self.ledger.wait_for_done(batch.keys, timeout_ms / 1000, mine=frozenset(batch.waiting)):
                    batch.answers.update(self.ledger.results(batch.keys, batch.waiting))
                if batch.waiting and self.now_ms() >= next_check:
                    self._check(batch, undispatched_after_ms)
                    next_check = self.now_ms() + check_ms
            except StoreError as exc:
                log.warning("store unavailable while waiting: %s", exc)
                self.sleep(min(0.2, max(0.0, (soonest - self.now_ms()) / 1000)))

    def _check(self, batch: Batch, undispatched_after_ms: int | None) -> None:
        """Lease and deadline checks, then pick up whatever got answered."""
        if self.on_check is not None:
            self.on_check(batch.keys)  # the run is visibly alive while its calls run
        reap(
            self.ledger,
            batch.keys,
            batch.waiting,
            now_ms=self.now_ms(),
            min_rerun_ms=int(self.settings.lease.ttl_s * 1000),
            writer=self.writer,
            redispatch=self.redispatch,
            undispatched_after_ms=undispatched_after_ms,
        )
        batch.answers.update(self.ledger.results(batch.keys, batch.waiting))

    def _store_fallbacks(self, batch: Batch) -> None:
        """Store answers prepared without a store, then deliver what the ledger holds."""
        pending = [call_id for call_id in batch.waiting if call_id in batch.fallbacks]
        if not pending:
            return
        try:
            for call_id in pending:
                self.ledger.finish(
                    batch.keys, batch.fallbacks[call_id], now_ms=self.now_ms(), writer=self.writer
                )
            batch.answers.update(self.ledger.results(batch.keys, pending))
        except StoreError:
            pass  # still unreachable: answered locally once the margin passes

    def _answer_locally_past(self, batch: Batch, now_ms: int, margin_ms: int) -> None:
        """Last resort when the store cannot answer: never let a call go past deadline + grace.

        The answer is what any other writer would store by then (the canonical deadline
        result, or the answer prepared at submission); it is stored first when Redis takes
        it, else handed over and stored as soon as Redis is back.
        """
        for call_id in batch.waiting:
            deadline_ms = batch.deadlines[call_id]
            if now_ms < deadline_ms + margin_ms:
                continue
            call = ToolCall(id=call_id, name=batch.tools.get(call_id) or "unknown")
            submitted_ms = batch.submitted.get(call_id, deadline_ms)
            result = self.ledger.with_fallback(
                batch.fallbacks.get(call_id)
                or deadline_result(call, submitted_ms=submitted_ms, deadline_ms=deadline_ms)
            )
            try:
                self.ledger.finish(batch.keys, result, now_ms=now_ms, writer=self.writer)
                result = self.ledger.results(batch.keys, [call_id]).get(call_id, result)
            except StoreError:
                if self.store_later is not None:
                    self.store_later(batch.keys, result)
            batch.answers[call_id] = result
