"""The asyncio ledger reads and writes the records the sync ledger does (same keys, same Lua)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from workers.core.models import CallState, SyntheticReason, ToolCall, ToolResult
from workers.core.results import success_result, synthetic_result
from workers.runtime import open_async_ledger, open_ledger
from workers.settings import Settings
from workers.store.done_listener import DoneListener
from workers.store.keys import RunKeys
from workers.store.ledger import AsyncLedger, Ledger
from workers.store.records import CallField


async def _listening_on(aio: AsyncLedger, *done_keys: str, timeout_s: float = 10.0) -> None:
    """Wait until the loop's listener has a ``BLPOP`` out on every one of ``done_keys``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    listener = aio._listener
    assert isinstance(listener, DoneListener)
    while not set(done_keys) <= listener._listening:
        assert asyncio.get_running_loop().time() < deadline, f"listener never blocked on {done_keys}"
        await asyncio.sleep(0.005)


@pytest.fixture
async def ledgers(settings: Settings) -> AsyncIterator[tuple[Ledger, AsyncLedger]]:
    sync, aio = open_ledger(settings), open_async_ledger(settings)
    yield sync, aio
    await aio.aclose()
    sync.close()


def _register(ledger: Ledger, keys: RunKeys, call_id: str) -> None:
    fields: dict[str, str] = {CallField.TOOL: "echo", CallField.DISPATCHED: "1"}
    assert ledger.register(keys, call_id, now_ms=1_000, deadline_ms=5_000, fields=fields)


async def test_first_writer_wins_across_both_clients(ledgers: tuple[Ledger, AsyncLedger]) -> None:
    sync, aio = ledgers
    keys = sync.keys("s", "r")
    _register(sync, keys, "c1")
    heard: list[str] = []
    aio.on_answered.append(lambda _keys, result: heard.append(result.tool_call_id))
    call = ToolCall(id="c1", name="echo")
    late = synthetic_result(call, SyntheticReason.DEADLINE_EXCEEDED, elapsed_ms=4_000, attempt=0)

    assert await aio.finish(keys, late, now_ms=5_000, writer="async")
    too_late = success_result(call, "too late", elapsed_ms=4_100, attempt=1)
    assert not sync.finish(keys, too_late, now_ms=5_100, writer="w")

    record = sync.record(keys, "c1")
    assert record is not None
    assert record.state is CallState.DONE
    assert record.result == late
    assert await aio.results(keys, ["c1"]) == {"c1": late}
    assert await aio.open_calls(keys, ["c1"]) == []
    assert await aio.run_call_ids(keys) == sync.run_call_ids(keys) == ["c1"]
    assert heard == ["c1"]


async def test_a_registration_is_written_while_every_command_connection_is_busy(
    ledgers: tuple[Ledger, AsyncLedger],
) -> None:
    # Given every connection of the ledger's command pool held, as waiters' checks hold them
    # when hundreds of batches wait on one loop
    sync, aio = ledgers
    pool = aio.client.connection_pool
    held = [await pool.get_connection() for _ in range(pool.max_connections)]  # type: ignore[no-untyped-call]
    try:
        # When a call is registered (the pool would refuse it: "No connection available")
        keys = sync.keys("s", "busy")
        fields: dict[str, str] = {CallField.TOOL: "echo", CallField.DISPATCHED: "1"}
        registration = await aio.register_call(keys, "c1", now_ms=1_000, deadline_ms=5_000, fields=fields)
    finally:
        for connection in held:
            await pool.release(connection)
    # Then it is written, on a connection of its own
    assert registration.created
    assert sync.record(keys, "c1") is not None


async def test_open_calls_and_a_wake_up_match_the_sync_ledger(ledgers: tuple[Ledger, AsyncLedger]) -> None:
    sync, aio = ledgers
    keys = sync.keys("s", "r2")
    _register(sync, keys, "c2")
    assert await aio.open_calls(keys, ["c2"]) == sync.open_calls(keys, ["c2"])
    assert await aio.wait_for_results(keys, 0.05, mine={"c2"}) is None

    waiting = asyncio.create_task(aio.wait_for_results(keys, 5.0, mine={"c2"}))
    # Whether the finish lands before or after the listener blocks, the signal stays in the
    # run's list until popped, so the wait returns either way.
    result: ToolResult = success_result(ToolCall(id="c2", name="echo"), "ok", elapsed_ms=5, attempt=1)
    await asyncio.to_thread(sync.finish, keys, result, now_ms=2_000, writer="worker")
    assert await asyncio.wait_for(waiting, 2.0) is not None
    assert await aio.results(keys, ["c2"]) == {"c2": result}


async def test_a_wake_up_brings_the_results_read_behind_its_signal(
    ledgers: tuple[Ledger, AsyncLedger], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two calls of a run waited on together, and a third run's waiter in the same loop
    sync, aio = ledgers
    keys, other = sync.keys("s", "r3"), sync.keys("s", "r4")
    for call_id in ("a", "b"):
        _register(sync, keys, call_id)
    _register(sync, other, "z")
    assert await aio.wait_for_results(keys, 0.05, mine={"a", "b"}, read=["a", "b"]) is None
    both = asyncio.create_task(aio.wait_for_results(keys, 5.0, mine={"a", "b"}, read=["a", "b"]))
    elsewhere = asyncio.create_task(aio.wait_for_results(other, 5.0, mine={"z"}, read=["z"]))
    # both waiting, the listener blocked on both runs' lists (the first wait's BLPOP, still
    # blocked on this run's list alone, would bring the signal without the results behind it)
    await _listening_on(aio, keys.done, other.done)

    async def no_second_round_trip(*_args: object) -> None:
        raise AssertionError("the results were not read behind the signal")

    monkeypatch.setattr(aio, "results", no_second_round_trip)

    # When one of the two calls is answered
    result: ToolResult = success_result(ToolCall(id="a", name="echo"), "ok", elapsed_ms=5, attempt=1)
    await asyncio.to_thread(sync.finish, keys, result, now_ms=2_000, writer="worker")

    # Then its waiter wakes with that answer (the other call has none yet), the other run's not
    assert await asyncio.wait_for(both, 2.0) == {"a": result}
    assert not elsewhere.done()
    late: ToolResult = success_result(ToolCall(id="z", name="echo"), "z", elapsed_ms=5, attempt=1)
    await asyncio.to_thread(sync.finish, other, late, now_ms=2_000, writer="worker")
    assert await asyncio.wait_for(elsewhere, 2.0) == {"z": late}
