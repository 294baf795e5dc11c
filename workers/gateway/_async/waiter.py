"""Waiting for a batch of calls: the driver of :mod:`workers.core.waiting`, written once.

The gateway hands a :class:`~workers.gateway.batch.Batch` to a waiter; every call in it is
answered no later than its deadline plus the grace, from the ledger when possible and
locally when Redis is gone. What to do next is decided once, by
:class:`workers.core.waiting.Waiting`; the driver only does the I/O each step names. Written
once: the asyncio driver (a waiting batch holds a connection, never a thread, so one event
loop can wait on thousands of sessions) is the source the sync one is generated from
(``make generate``), so both cost the same round trips. The waiter only reads the batch: it
returns the answers it learned, and the gateway applies them.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from workers.answering.service import Answers
from workers.core.models import ToolResult
from workers.core.reaping import ReapRules
from workers.core.waiting import AnswerLocally, Block, Check, Finish, Read, Store, Waiting
from workers.errors import StoreError
from workers.gateway.batch import Batch
from workers.settings import Settings
from workers.store.keys import RunKeys
from workers.store.ledger import AsyncLedger

__all__ = ["AsyncWaiter"]

log = logging.getLogger(__name__)

# Checks (lease, deadline, progress: three round trips) one process makes per second at
# most, before each batch's check interval stretches: with thousands of batches waiting, a
# fixed interval would keep the process busy with checks and make every answer late. Deadlines
# do not depend on checks: each batch also wakes at its soonest deadline plus half the grace.
_CHECKS_PER_S = 100


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
class AsyncWaiter:
    """Waits until every call of a batch has its one result.

    ``redispatch`` sends a lost call's task again (through Celery: the asyncio gateway hands it
    to a thread); ``sleep`` waits while the store is unreachable.
    """

    ledger: AsyncLedger
    settings: Settings
    writer: str
    now_ms: Callable[[], int]
    sleep: Callable[[float], Awaitable[None]]
    redispatch: Callable[[RunKeys, str], Awaitable[None]]
    store_later: Callable[[RunKeys, ToolResult], None] | None = None
    answers: Answers = field(init=False)  # what it answers goes through the answering service
    # The batches being waited on (a set: its add and discard are atomic across threads).
    _batches: set[int] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self.answers = Answers(writer=self.writer, fallbacks=self.settings.tools.failure_rules().fallbacks)

    async def wait(self, batch: Batch, *, undispatched_after_ms: int | None = None) -> dict[str, ToolResult]:
        """The answers to ``batch.waiting``, each by its deadline plus grace (``batch`` is only read)."""
        self._batches.add(id(batch))
        try:
            return await self._wait(batch, undispatched_after_ms)
        finally:
            self._batches.discard(id(batch))

    def _check_interval_ms(self) -> int:
        configured_ms = int(self.settings.gateway.check_interval_s * 1000)
        return max(configured_ms, len(self._batches) * 1000 // _CHECKS_PER_S)

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
                    with contextlib.suppress(StoreError):  # the loop's own handling takes over
                        machine.learn(await ledger.results(keys, call_ids))
                case Store(results) as store:
                    with contextlib.suppress(StoreError):  # answered locally once the margin passes
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
                    try:  # the wake-up and the reads of its results: one round trip
                        woken = await ledger.wait_for_results(
                            keys, timeout_s, mine=frozenset(call_ids), read=call_ids
                        )
                        machine.learn(woken or {})
                    except StoreError as exc:
                        log.warning("store unavailable while waiting: %s", exc)
                        await self.sleep(machine.unreachable(self.now_ms()))
                case Check(call_ids):
                    try:
                        await self._check(machine, keys, call_ids)
                        machine.checked(self.now_ms() + self._check_interval_ms())
                    except StoreError as exc:
                        log.warning("store unavailable while waiting: %s", exc)
                        await self.sleep(machine.unreachable(self.now_ms()))

    async def _check(self, machine: Waiting, keys: RunKeys, call_ids: list[str]) -> None:
        """The run's progress, lease and deadline checks, then pick up whatever got answered."""
        try:
            await self.ledger.touch_progress(keys, self.now_ms())  # the run is visibly alive
        except StoreError as exc:
            log.warning("progress of %s/%s not recorded: %s", keys.session_key, keys.run_id, exc)
        now_ms = self.now_ms()
        reaps = machine.reaps(await self.ledger.open_calls(keys, call_ids), now_ms=now_ms)
        _, resend = await self.answers.reap(keys, reaps, now_ms=now_ms).on_async(self.ledger)
        for call_id in resend:
            await self.redispatch(keys, call_id)
        machine.learn(await self.ledger.results(keys, call_ids))
