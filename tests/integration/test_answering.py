"""The answering service on a real redis-server: a writer that loses the race gets the kept answer."""

from __future__ import annotations

import time

from workers.answering.service import Answers
from workers.core.failure_policy import FallbackRule
from workers.core.models import SyntheticReason, ToolCall
from workers.core.results import success_result, synthetic_result
from workers.runtime import open_async_ledger
from workers.settings import Settings
from workers.store.ledger import Ledger
from workers.store.records import CallField


def _register(ledger: Ledger, session: str, call_id: str, now_ms: int) -> None:
    keys = ledger.keys(session, "r1")
    fields = {CallField.TOOL.value: "fetch"}
    ledger.register(keys, call_id, now_ms=now_ms, deadline_ms=now_ms + 60_000, fields=fields)


def test_a_losing_writer_gets_the_kept_answer_and_the_winner_its_own(ledger: Ledger) -> None:
    # Given a registered call, a worker's answering service and a gateway's with a fallback for it
    now = int(time.time() * 1000)
    _register(ledger, "race", "c1", now)
    keys, call = ledger.keys("race", "r1"), ToolCall(id="c1", name="fetch")
    worker = Answers(writer="worker", fallbacks={})
    gateway = Answers(writer="gateway", fallbacks={"fetch": FallbackRule("cached")})
    real = success_result(call, "the tool's own answer", elapsed_ms=5, attempt=1)
    cancelled = synthetic_result(call, SyntheticReason.CANCELLED, elapsed_ms=6, attempt=1)
    # When the worker writes first, then the gateway answers the call cancelled
    first = worker.answer(keys, real, now_ms=now + 5).on(ledger)
    second = gateway.answer(keys, cancelled, now_ms=now + 6).on(ledger)
    # Then the winner got its own answer, the loser the kept one (not its fallback), and the
    # ledger holds the worker's, with the gateway's kept as late
    assert (first.won, first.result) == (True, real)
    assert (second.won, second.result) == (False, real)
    assert ledger.results(keys, ["c1"])["c1"] == real
    [late] = ledger.late_results(keys, "c1")
    assert (late.text, late.reason) == ("cached", SyntheticReason.CANCELLED.value)


async def test_the_asyncio_path_answers_the_same(ledger: Ledger, settings: Settings) -> None:
    # Given a call the sync ledger answered first
    now = int(time.time() * 1000)
    _register(ledger, "arace", "c1", now)
    keys, call = ledger.keys("arace", "r1"), ToolCall(id="c1", name="fetch")
    real = success_result(call, "first", elapsed_ms=5, attempt=1)
    assert Answers(writer="worker", fallbacks={}).offer(keys, real, now_ms=now + 5).on(ledger)
    # When a writer on the asyncio ledger answers it too
    aledger = open_async_ledger(settings)
    try:
        timeout = synthetic_result(call, SyntheticReason.TIMEOUT_SOFT, elapsed_ms=6, attempt=1)
        answers = Answers(writer="gateway", fallbacks={})
        answered = await answers.answer(keys, timeout, now_ms=now + 6).on_async(aledger)
    finally:
        await aledger.aclose()
    # Then it gets the kept answer back
    assert (answered.won, answered.result) == (False, real)
