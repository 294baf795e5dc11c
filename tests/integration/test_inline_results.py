"""A call's done signal carries its result: its waiter reads no record, sync or async.

Commands are counted with ``INFO commandstats`` on this test's own redis-server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis

from workers.core.models import ToolCall, ToolResult
from workers.core.results import success_result
from workers.runtime import open_async_ledger, open_ledger
from workers.settings import Settings
from workers.store.keys import RunKeys
from workers.store.ledger import HANDED_BACK, SEPARATOR, AsyncLedger, Ledger, Signal, encode
from workers.store.records import CallField

Ledgers = tuple[Ledger, AsyncLedger]


@pytest.fixture
async def ledgers(settings: Settings) -> AsyncIterator[Ledgers]:
    sync, aio = open_ledger(settings), open_async_ledger(settings)
    yield sync, aio
    await aio.aclose()
    sync.close()


def _registered(ledger: Ledger, keys: RunKeys, call_id: str) -> None:
    fields: dict[str, str] = {CallField.TOOL: "echo", CallField.DISPATCHED: "1"}
    assert ledger.register(keys, call_id, now_ms=1_000, deadline_ms=60_000, fields=fields)


def _answered(
    ledger: Ledger, keys: RunKeys, call_id: str, text: str = "ok", *, registered: bool = False
) -> ToolResult:
    if not registered:
        _registered(ledger, keys, call_id)
    result = success_result(ToolCall(id=call_id, name="echo"), text, elapsed_ms=5, attempt=1)
    assert ledger.finish(keys, result, now_ms=2_000, writer="worker")
    return result


def _reset_counts(client: redis.Redis) -> None:
    client.config_resetstat()


def _count(client: redis.Redis, command: str) -> int:
    return _counts(client, command)[0]


def _counts(client: redis.Redis, *commands: str) -> tuple[int, ...]:
    stats = client.info("commandstats")
    return tuple(int(stats.get(f"cmdstat_{command}", {}).get("calls", 0)) for command in commands)


def _as_older_worker(ledger: Ledger, keys: RunKeys, call_id: str) -> None:
    """Leave the bare call id on the done list, as a finish of a not yet upgraded worker does."""
    ledger.client.delete(keys.done)
    ledger.client.rpush(keys.done, call_id)


@pytest.mark.parametrize("call_id", ["c1", "a\x1fb", "\x00starts-with-nul", "\u4e2d:{x}/%", "x" * 256])
def test_the_finish_script_pushes_what_the_signal_reader_reads(ledgers: Ledgers, call_id: str) -> None:
    sync, _aio = ledgers
    keys = sync.keys("s", "lua")
    result = _answered(sync, keys, call_id, text="a result with \x1f and \x00 in it")
    [raw] = [str(signal) for signal in sync.client.lrange(keys.done, 0, -1)]
    assert raw == encode(call_id, result.to_json())
    signal = Signal.parse(raw)
    assert (signal.call_id, signal.handed_back, signal.answer()) == (call_id, False, result)


def test_a_sync_wait_for_one_call_pops_its_answer_and_reads_nothing(ledgers: Ledgers) -> None:
    sync, _aio = ledgers
    keys = sync.keys("s", "one")
    result = _answered(sync, keys, "c1")
    _reset_counts(sync.client)
    assert sync.wait_for_results(keys, 1.0, mine={"c1"}, read=["c1"]) == {"c1": result}
    assert _counts(sync.client, "blpop", "hget") == (1, 0)


async def test_an_async_wait_for_one_call_pops_its_answer_and_reads_nothing(
    ledgers: Ledgers,
) -> None:
    sync, aio = ledgers
    keys = sync.keys("s", "aone")
    assert await aio.wait_for_results(keys, 0.05, mine={"c1"}, read=["c1"]) is None  # listener up
    _registered(sync, keys, "c1")  # before the count: the register script reads the record itself
    waiting = asyncio.create_task(aio.wait_for_results(keys, 5.0, mine={"c1"}, read=["c1"]))
    await asyncio.sleep(0.05)
    _reset_counts(sync.client)
    result = await asyncio.to_thread(_answered, sync, keys, "c1", registered=True)
    assert await asyncio.wait_for(waiting, 2.0) == {"c1": result}
    assert _count(sync.client, "hget") == 0


def test_a_bare_id_from_an_older_worker_is_answered_in_the_same_wake(ledgers: Ledgers) -> None:
    sync, _aio = ledgers
    keys = sync.keys("s", "old")
    result = _answered(sync, keys, "c1")
    _as_older_worker(sync, keys, "c1")
    _reset_counts(sync.client)
    assert sync.wait_for_results(keys, 1.0, mine={"c1"}, read=["c1"]) == {"c1": result}
    assert _counts(sync.client, "blpop", "hget") == (1, 1)


async def test_an_async_waiter_answers_a_bare_id_from_an_older_worker(ledgers: Ledgers) -> None:
    sync, aio = ledgers
    keys = sync.keys("s", "aold")
    result = _answered(sync, keys, "c1")
    _as_older_worker(sync, keys, "c1")
    assert await aio.wait_for_results(keys, 2.0, mine={"c1"}, read=["c1"]) == {"c1": result}


def test_a_handed_back_signal_brings_its_owner_the_answer(ledgers: Ledgers) -> None:
    # Given a waiter of another call that pops the answered call's signal and hands it back
    sync, _aio = ledgers
    keys = sync.keys("s", "handed")
    result = _answered(sync, keys, "theirs")
    assert sync.wait_for_results(keys, 1.0, mine={"mine"}, read=["mine"]) == {}
    [handed] = [str(signal) for signal in sync.client.lrange(keys.done, 0, -1)]
    assert handed.startswith(HANDED_BACK)
    assert SEPARATOR in handed
    # When the call's own waiter pops it, it has its answer without a read
    _reset_counts(sync.client)
    assert sync.wait_for_results(keys, 1.0, mine={"theirs"}, read=["theirs"]) == {"theirs": result}
    assert _count(sync.client, "hget") == 0
    assert sync.client.llen(keys.done) == 0  # a marked signal is never handed back again


async def test_an_async_owner_of_a_handed_back_signal_reads_nothing(ledgers: Ledgers) -> None:
    sync, aio = ledgers
    keys = sync.keys("s", "ahanded")
    result = _answered(sync, keys, "theirs")
    assert sync.wait_for_results(keys, 1.0, mine={"mine"}) is not None  # handed back, marked
    _reset_counts(sync.client)
    assert await aio.wait_for_results(keys, 2.0, mine={"theirs"}, read=["theirs"]) == {"theirs": result}
    assert _count(sync.client, "hget") == 0


def test_another_calls_signal_is_followed_by_a_read_of_mine_in_one_round_trip(
    ledgers: Ledgers,
) -> None:
    # Given two calls answered, the other first: its signal is popped first
    sync, _aio = ledgers
    keys = sync.keys("s", "other")
    _answered(sync, keys, "theirs")
    mine = _answered(sync, keys, "mine")
    # When a waiter of "mine" wakes on "theirs", it still has its answer in this wake
    _reset_counts(sync.client)
    assert sync.wait_for_results(keys, 1.0, mine={"mine"}, read=["mine"]) == {"mine": mine}
    assert _counts(sync.client, "blpop", "hget", "rpush") == (1, 1, 1)
    # And the other call's signal went back, marked, with its result
    handed = Signal.parse(str(sync.client.lrange(keys.done, 0, -1)[-1]))
    assert (handed.call_id, handed.handed_back, handed.result is not None) == ("theirs", True, True)


async def test_an_async_waiter_woken_by_a_marked_stranger_reads_its_call(ledgers: Ledgers) -> None:
    # Given the only signal left is another call's, handed back, and my call answered earlier
    sync, aio = ledgers
    keys = sync.keys("s", "astranger")
    mine = _answered(sync, keys, "mine")
    sync.client.delete(keys.done)  # its signal was taken long ago
    _answered(sync, keys, "theirs")
    assert sync.wait_for_results(keys, 1.0, mine={"nobody"}) is not None
    # Then a waiter of "mine" woken by it reads its own call, in the same wake
    assert await aio.wait_for_results(keys, 2.0, mine={"mine"}, read=["mine"]) == {"mine": mine}


def test_several_calls_are_still_read_behind_the_pop(ledgers: Ledgers) -> None:
    sync, _aio = ledgers
    keys = sync.keys("s", "several")
    a, b = _answered(sync, keys, "a"), _answered(sync, keys, "b")
    _reset_counts(sync.client)
    assert sync.wait_for_results(keys, 1.0, mine={"a", "b"}, read=["a", "b"]) == {"a": a, "b": b}
    assert _count(sync.client, "hget") == 2
