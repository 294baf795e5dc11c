"""Waiting for a batch of calls: the sync and asyncio drivers of :mod:`workers.core.waiting`.

The gateway hands a :class:`Batch` to a waiter; every call in it is answered no later than
its deadline plus the grace, from the ledger when possible and locally when Redis is gone.
What to do next is decided once, by :class:`workers.core.waiting.Waiting`; the drivers here
only do the I/O each step names, :class:`Waiter` on the sync ledger and :class:`AsyncWaiter`
awaited on ``redis.asyncio`` (a waiting batch holds a connection, never a thread, so one event
loop can wait on thousands of sessions). The waiter only reads the batch: it returns the
answers it learned, and the gateway applies them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.answering.service import Answers
from workers.core.loops import LoopVerdict, PendingCall
from workers.core.models import ToolCall, ToolResult
from workers.core.reaping import OpenCall, ReapRules
from workers.core.waiting import AnswerLocally, Block, Check, Finish, Read, Store, Waiting
from workers.errors import StoreError
from workers.settings import Settings
from workers.store.keys import RunKeys
from workers.store.ledger import AsyncLedger, Ledger
from workers.store.sessions import RunAbort

__all__ = ["Abort", "AsyncWaiter", "Batch", "Offload", "Waiter"]

log = logging.getLogger(__name__)

# Checks (lease, deadline, progress: three round trips) one event loop makes per second at
# most, before each batch's check interval stretches: with thousands of batches waiting, a
# fixed interval would keep the loop busy with checks and make every answer late. Deadlines
# do not depend on checks: each batch also wakes at its soonest deadline plus half the grace.
_CHECKS_PER_S = 100

Offload = Callable[..., Awaitable[Any]]
"""Runs a blocking ``function(*args)`` off the event loop: ``await offload(function, *args)``."""


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
    # Calls of an agent without loop detection: judged (hashed) only if a compaction guard
    # turns out armed and their outcomes must be recorded.
    unjudged: dict[str, ToolCall] = field(default_factory=dict)
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


def _waiting(
    batch: Batch,
    settings: Settings,
    *,
    first_check_ms: int,
    undispatched_after_ms: int | None,
) -> Waiting:
    """The decisions of one wait on ``batch``, on the gateway's settings.

    The call registered by the batch's last round trip is not read before the first block:
    between that reply and the block no worker can have taken, run and answered it, so for
    the usual batch of one new call this saves a round trip. The others are read, since their
    wake-up signal may be gone (another waiter of the run pops it and hands it back marked,
    and a marked signal is never handed back twice); a result is written before its signal.
    """
    lease_ms = int(settings.lease.ttl_s * 1000)
    rules = ReapRules(
        min_rerun_ms=lease_ms,
        undispatched_after_ms=undispatched_after_ms,
        republish_after_ms=lease_ms if settings.gateway.republish_unclaimed else None,
    )
    return Waiting(
        deadlines=batch.deadlines,
        margin_ms=int(settings.gateway.grace_s * 1000) // 2,
        next_check_ms=first_check_ms,
        rules=rules,
        answered=frozenset(batch.answers),
        prepared=batch.fallbacks,
        tools=batch.tools,
        submitted=batch.submitted,
        read_first=[cid for cid in batch.waiting if cid != batch.registered_last],
    )


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
    answers: Answers = field(init=False)  # what it answers goes through the answering service

    def __post_init__(self) -> None:
        self.answers = Answers(writer=self.writer, fallbacks=self.settings.tools.failure_rules().fallbacks)

    def wait(self, batch: Batch, *, undispatched_after_ms: int | None = None) -> dict[str, ToolResult]:
        """The answers to ``batch.waiting``, each call's by its deadline plus grace."""
        check_ms = int(self.settings.gateway.check_interval_s * 1000)
        first_check_ms = self.now_ms() + check_ms
        machine = _waiting(
            batch,
            self.settings,
            first_check_ms=first_check_ms,
            undispatched_after_ms=undispatched_after_ms,
        )
        keys, ledger = batch.keys, self.ledger
        while True:
            match machine.step(self.now_ms()):
                case Finish(answers):
                    return answers
                case Read(call_ids):
                    with contextlib.suppress(StoreError):  # the loop's own handling takes over
                        machine.learn(ledger.results(keys, call_ids))
                case Store(results) as store:
                    with contextlib.suppress(StoreError):  # answered locally once the margin passes
                        for result in results:
                            self.answers.offer(keys, result, now_ms=self.now_ms()).on(ledger)
                        machine.learn(ledger.results(keys, store.call_ids))
                case AnswerLocally(results):
                    for result in results:
                        answer = self.answers.hand_on(
                            keys, result, now_ms=self.now_ms(), store_later=self.store_later
                        )
                        machine.learn({result.tool_call_id: answer.on(ledger)})
                case Block(call_ids, timeout_s):
                    try:  # the wake-up and the reads of its results: one round trip
                        woken = ledger.wait_for_results(
                            keys, timeout_s, mine=frozenset(call_ids), read=call_ids
                        )
                        machine.learn(woken or {})
                    except StoreError as exc:
                        log.warning("store unavailable while waiting: %s", exc)
                        self.sleep(machine.unreachable(self.now_ms()))
                case Check(call_ids):
                    try:
                        self._check(machine, keys, call_ids)
                        machine.checked(self.now_ms() + check_ms)
                    except StoreError as exc:
                        log.warning("store unavailable while waiting: %s", exc)
                        self.sleep(machine.unreachable(self.now_ms()))

    def _check(self, machine: Waiting, keys: RunKeys, call_ids: list[str]) -> None:
        """Lease and deadline checks, then pick up whatever got answered."""
        if self.on_check is not None:
            self.on_check(keys)  # the run is visibly alive while its calls run
        now_ms = self.now_ms()
        reaps = machine.reaps(self.ledger.open_calls(keys, call_ids), now_ms=now_ms)
        _, resend = self.answers.reap(keys, reaps, now_ms=now_ms).on(self.ledger)
        for call_id in resend:
            self.redispatch(keys, call_id)
        machine.learn(self.ledger.results(keys, call_ids))


@dataclass
class AsyncWaiter:
    """Awaits until every call of a batch has its one result.

    The only blocking step, sending a lost call's task again through Celery, is rare and
    handed to ``offload``.
    """

    ledger: AsyncLedger
    settings: Settings
    writer: str
    now_ms: Callable[[], int]
    redispatch: Callable[[RunKeys, str], None]
    offload: Offload
    store_later: Callable[[RunKeys, ToolResult], None] | None = None
    waiting_batches: int = 0
    answers: Answers = field(init=False)  # what it answers goes through the answering service

    def __post_init__(self) -> None:
        self.answers = Answers(writer=self.writer, fallbacks=self.settings.tools.failure_rules().fallbacks)

    async def wait(self, batch: Batch, *, undispatched_after_ms: int | None = None) -> dict[str, ToolResult]:
        """The answers to ``batch.waiting``, each by its deadline plus grace (``batch`` is only read)."""
        self.waiting_batches += 1
        try:
            return await self._wait(batch, undispatched_after_ms)
        finally:
            self.waiting_batches -= 1

    def _check_interval_ms(self) -> int:
        configured_ms = int(self.settings.gateway.check_interval_s * 1000)
        return max(configured_ms, self.waiting_batches * 1000 // _CHECKS_PER_S)

    async def _wait(self, batch: Batch, undispatched_after_ms: int | None) -> dict[str, ToolResult]:
        check_ms = self._check_interval_ms()
        # Spread the first check: batches submitted together would otherwise check together.
        first_check_ms = self.now_ms() + check_ms // 2 + random.randrange(check_ms // 2 + 1)
        machine = _waiting(
            batch,
            self.settings,
            first_check_ms=first_check_ms,
            undispatched_after_ms=undispatched_after_ms,
        )
        keys, ledger = batch.keys, self.ledger
        while True:
            match machine.step(self.now_ms()):
                case Finish(answers):
                    return answers
                case Read(call_ids):
                    with contextlib.suppress(StoreError):
                        machine.learn(await ledger.results(keys, call_ids))
                case Store(results) as store:
                    with contextlib.suppress(StoreError):
                        for result in results:
                            await self.answers.offer(keys, result, now_ms=self.now_ms()).on_async(ledger)
                        machine.learn(await ledger.results(keys, store.call_ids))
                case AnswerLocally(results):
                    for result in results:
                        answer = self.answers.hand_on(
                            keys, result, now_ms=self.now_ms(), store_later=self.store_later
                        )
                        machine.learn({result.tool_call_id: await answer.on_async(ledger)})
                case Block(call_ids, timeout_s):
                    try:
                        woken = await ledger.wait_for_results(
                            keys, timeout_s, mine=frozenset(call_ids), read=call_ids
                        )
                        machine.learn(woken or {})
                    except StoreError as exc:
                        log.warning("store unavailable while waiting: %s", exc)
                        await asyncio.sleep(machine.unreachable(self.now_ms()))
                case Check(call_ids):
                    try:
                        await self._check(machine, keys, call_ids)
                        machine.checked(self.now_ms() + self._check_interval_ms())
                    except StoreError as exc:
                        log.warning("store unavailable while waiting: %s", exc)
                        await asyncio.sleep(machine.unreachable(self.now_ms()))

    async def _check(self, machine: Waiting, keys: RunKeys, call_ids: list[str]) -> None:
        """Lease and deadline checks, then pick up whatever got answered."""
        try:
            await self.ledger.touch_progress(keys, self.now_ms())  # the run is visibly alive
        except StoreError as exc:
            log.warning("progress of %s/%s not recorded: %s", keys.session_key, keys.run_id, exc)
        now_ms = self.now_ms()
        reaps = machine.reaps(await self.ledger.open_calls(keys, call_ids), now_ms=now_ms)
        _, resend = await self.answers.reap(keys, reaps, now_ms=now_ms).on_async(self.ledger)
        for call_id in resend:
            await self.offload(self.redispatch, keys, call_id)
        machine.learn(await self.ledger.results(keys, call_ids))
