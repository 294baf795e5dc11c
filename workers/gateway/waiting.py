"""Waiting for a batch of calls: wake on answers, check leases and deadlines, never overrun.

The gateway hands a :class:`Batch` to :class:`Waiter`; every call in it is answered no later
than its deadline plus the grace, from the ledger when possible and locally when Redis is
gone. The waiter only reads the batch: it returns the answers it learned (an
:class:`Outstanding`), and the gateway applies them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from workers.answering import reap
from workers.core.loops import LoopVerdict, PendingCall
from workers.core.models import ToolCall, ToolResult
from workers.core.reaper import OpenCall
from workers.core.results import deadline_result
from workers.errors import StoreError
from workers.settings import Settings
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger
from workers.store.runs import RunAbort

__all__ = ["Abort", "Batch", "Outstanding", "Waiter"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Abort:
    """This run is aborted, and why: the one representation on the call's path.

    ``recorded``: the store already holds it (read from the run, or the run refused a call);
    otherwise it was decided in this batch and the gateway records it when concluding.
    """

    detector: str
    count: int
    message: str
    recorded: bool

    @classmethod
    def found(cls, record: RunAbort) -> Abort:
        """An abort the store already holds."""
        return cls(record.detector, record.count, record.message, recorded=True)

    @classmethod
    def decided(cls, verdict: LoopVerdict) -> Abort:
        """An abort the loop detector decided in this batch, not yet recorded."""
        detector = verdict.detector.value if verdict.detector else "loop"
        return cls(detector, verdict.count, verdict.message, recorded=False)

    @property
    def record(self) -> RunAbort:
        """The abort as the run record stores it."""
        return RunAbort(self.detector, self.count, self.message)


@dataclass
class Batch:
    """Calls of one run being waited for: call id -> deadline (ms), plus answers so far.

    Owned by the gateway: only its call path changes it (a waiter returns what it learned).
    """

    keys: RunKeys
    agent_id: str = "main"
    deadlines: dict[str, int] = field(default_factory=dict)
    pending_loops: dict[str, PendingCall] = field(default_factory=dict)
    abort: Abort | None = None
    run_deadline_ms: int | None = None
    guard_armed: bool = False
    tools: dict[str, str] = field(default_factory=dict)
    submitted: dict[str, int] = field(default_factory=dict)
    # The call registered (new) by the batch's last store round trip, if that was the last one:
    # no worker can have answered it before the first block (see Waiter._read_before_blocking).
    registered_last: str | None = None
    answers: dict[str, ToolResult] = field(default_factory=dict)
    # Answers prepared while the store was unreachable: stored (first writer wins) as soon as
    # it answers, and what the ledger then holds is delivered.
    fallbacks: dict[str, ToolResult] = field(default_factory=dict)

    @classmethod
    def collected(
        cls,
        keys: RunKeys,
        call_ids: Sequence[str],
        answers: Mapping[str, ToolResult],
        open_calls: Sequence[OpenCall],
    ) -> Batch:
        """The batch ``collect`` waits on: every call of the run, answered or still open."""
        batch = cls(keys)
        batch.answers.update(answers)
        for call in open_calls:
            batch.deadlines[call.call_id] = call.deadline_ms
            batch.submitted[call.call_id] = call.submitted_ms
            batch.tools[call.call_id] = call.tool
        for call_id in call_ids:
            batch.deadlines.setdefault(call_id, 0)
        return batch

    @property
    def waiting(self) -> list[str]:
        """Call ids still without an answer."""
        return [cid for cid in self.deadlines if cid not in self.answers]

    def note_abort(self, abort: Abort | None) -> None:
        """The one place the batch learns its run is aborted: the first reason stays.

        An abort the store already holds wins over one decided here (that one is not recorded).
        """
        if abort is None:
            return
        if self.abort is None or (abort.recorded and not self.abort.recorded):
            self.abort = abort


class Outstanding:
    """What one wait learned about a batch it only reads: answers to its open calls."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.answers: dict[str, ToolResult] = {}

    @property
    def waiting(self) -> list[str]:
        """Call ids of the batch still without an answer, counting what this wait learned."""
        batch = self.batch
        return [cid for cid in batch.deadlines if cid not in batch.answers and cid not in self.answers]

    def learn(self, answers: Mapping[str, ToolResult]) -> None:
        """Keep answers read from the ledger."""
        self.answers.update(answers)

    def past_margin(self, now_ms: int, margin_ms: int) -> list[ToolResult]:
        """Answers for the calls past deadline + ``margin_ms``: what any writer stores by then.

        The answer prepared at submission, else the canonical deadline result (before
        ``tools.fallbacks``, which the ledger applies).
        """
        batch, due = self.batch, []
        for call_id in self.waiting:
            deadline_ms = batch.deadlines[call_id]
            if now_ms < deadline_ms + margin_ms:
                continue
            call = ToolCall(id=call_id, name=batch.tools.get(call_id) or "unknown")
            submitted_ms = batch.submitted.get(call_id, deadline_ms)
            due.append(
                batch.fallbacks.get(call_id)
                or deadline_result(call, submitted_ms=submitted_ms, deadline_ms=deadline_ms)
            )
        return due


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

    def wait(self, batch: Batch, *, undispatched_after_ms: int | None = None) -> dict[str, ToolResult]:
        """The answers to ``batch.waiting``, each call's by its deadline plus grace."""
        out = Outstanding(batch)
        margin_ms = int(self.settings.gateway.grace_s * 1000) // 2
        check_ms = int(self.settings.gateway.check_interval_s * 1000)
        next_check = self.now_ms() + check_ms
        self._read_before_blocking(out)
        while out.waiting:
            self._store_fallbacks(out)
            self._answer_locally_past(out, self.now_ms(), margin_ms)
            if not out.waiting:
                break
            soonest = min(batch.deadlines[cid] for cid in out.waiting) + margin_ms
            timeout_ms = max(10, min(next_check, soonest) - self.now_ms())
            try:
                waiting = out.waiting  # the wake-up and the reads of its results: one round trip
                answers = self.ledger.wait_for_results(
                    batch.keys, timeout_ms / 1000, mine=frozenset(waiting), read=waiting
                )
                if answers is not None:
                    out.learn(answers)
                if out.waiting and self.now_ms() >= next_check:
                    self._check(out, undispatched_after_ms)
                    next_check = self.now_ms() + check_ms
            except StoreError as exc:
                log.warning("store unavailable while waiting: %s", exc)
                self.sleep(min(0.2, max(0.0, (soonest - self.now_ms()) / 1000)))
        return out.answers

    def _read_before_blocking(self, out: Outstanding) -> None:
        """Pick up answers that came while the batch was being submitted.

        Their wake-up signal may be gone: another waiter of the run pops it, hands it back
        marked, and, if this one is not blocked yet, pops the marked signal again itself (a
        marked signal is never handed back twice). Reading once before the first block closes
        that gap; the result is written before its signal, so it is there to read.

        The call registered by the batch's last round trip is left out: between that reply and
        the first block no worker can have taken, run and answered it (the same gap stays open
        after any read), so for the usual batch of one new call this saves a round trip.
        """
        batch = out.batch
        earlier = [call_id for call_id in out.waiting if call_id != batch.registered_last]
        if not earlier:
            return
        with contextlib.suppress(StoreError):  # unreachable: the loop's own handling takes over
            out.learn(self.ledger.results(batch.keys, earlier))

    def _check(self, out: Outstanding, undispatched_after_ms: int | None) -> None:
        """Lease and deadline checks, then pick up whatever got answered."""
        batch = out.batch
        if self.on_check is not None:
            self.on_check(batch.keys)  # the run is visibly alive while its calls run
        lease_ms = int(self.settings.lease.ttl_s * 1000)
        reap(
            self.ledger,
            batch.keys,
            out.waiting,
            now_ms=self.now_ms(),
            min_rerun_ms=lease_ms,
            writer=self.writer,
            redispatch=self.redispatch,
            undispatched_after_ms=undispatched_after_ms,
            republish_after_ms=lease_ms if self.settings.gateway.republish_unclaimed else None,
        )
        out.learn(self.ledger.results(batch.keys, out.waiting))

    def _store_fallbacks(self, out: Outstanding) -> None:
        """Store answers prepared without a store, then deliver what the ledger holds."""
        batch = out.batch
        pending = [call_id for call_id in out.waiting if call_id in batch.fallbacks]
        if not pending:
            return
        try:
            for call_id in pending:
                self.ledger.finish(
                    batch.keys, batch.fallbacks[call_id], now_ms=self.now_ms(), writer=self.writer
                )
            out.learn(self.ledger.results(batch.keys, pending))
        except StoreError:
            pass  # still unreachable: answered locally once the margin passes

    def _answer_locally_past(self, out: Outstanding, now_ms: int, margin_ms: int) -> None:
        """Last resort when the store cannot answer: never let a call go past deadline + grace.

        The answer is what any other writer would store by then (the canonical deadline
        result, or the answer prepared at submission); it is stored first when Redis takes
        it, else handed over and stored as soon as Redis is back.
        """
        batch = out.batch
        for prepared in out.past_margin(now_ms, margin_ms):
            call_id, result = prepared.tool_call_id, self.ledger.with_fallback(prepared)
            try:
                self.ledger.finish(batch.keys, result, now_ms=now_ms, writer=self.writer)
                result = self.ledger.results(batch.keys, [call_id]).get(call_id, result)
            except StoreError:
                if self.store_later is not None:
                    self.store_later(batch.keys, result)
            out.answers[call_id] = result
