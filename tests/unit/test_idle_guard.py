"""The LLM idle guard: sync streams through a producer thread, async streams per chunk."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

from workers.errors import ConfigError, StreamIdleTimeout
from workers.gateway.idle_guard import aidle_guard, default_idle_timeout_s, idle_guard
from workers.settings import AgentOverride, AgentsSettings, Settings

TINY_S = 0.05


class BlockingStream:
    """Yields ``chunks`` then blocks in ``next()`` until released, like a dead socket read."""

    def __init__(self, chunks: list[str]) -> None:
        self.chunks = list(chunks)
        self.release = threading.Event()
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        if self.chunks:
            return self.chunks.pop(0)
        self.release.wait(5)
        raise StopIteration

    def close(self) -> None:
        self.closed.set()


def test_sync_stream_passes_every_chunk_through() -> None:
    # Given a stream that ends normally
    # When it is guarded
    chunks = list(idle_guard(iter(["a", "b", "c"]), idle_timeout_s=1.0))
    # Then every chunk arrives in order
    assert chunks == ["a", "b", "c"]


def test_sync_stream_blocked_in_next_raises_idle_timeout() -> None:
    # Given a stream that sends one chunk and then blocks forever
    stream = BlockingStream(["first"])
    guarded = idle_guard(stream, idle_timeout_s=TINY_S)
    # When the consumer reads past the first chunk
    assert next(guarded) == "first"
    with pytest.raises(StreamIdleTimeout) as raised:
        next(guarded)
    # Then the typed timeout names the limit, and the abandoned producer closes the stream once freed
    assert raised.value.idle_s == TINY_S
    assert not stream.closed.is_set()
    stream.release.set()
    assert stream.closed.wait(2)


def test_on_idle_is_called_to_unblock_the_producer() -> None:
    # Given a stream whose connection can be closed from outside
    stream = BlockingStream([])
    # When the guard times out
    with pytest.raises(StreamIdleTimeout):
        next(idle_guard(stream, idle_timeout_s=TINY_S, on_idle=stream.release.set))
    # Then on_idle ran, which let the producer thread finish and close the stream
    assert stream.closed.wait(2)


def test_sync_stream_errors_reach_the_consumer_unchanged() -> None:
    def failing() -> Iterator[str]:
        yield "ok"
        raise ValueError("provider said no")

    guarded = idle_guard(failing(), idle_timeout_s=1.0)
    assert next(guarded) == "ok"
    with pytest.raises(ValueError, match="provider said no"):
        next(guarded)


def test_consumer_time_between_chunks_is_not_idle_time() -> None:
    # Given a guard with a tiny timeout and a slow consumer
    done = threading.Event()
    seen = []
    for chunk in idle_guard(iter(range(3)), idle_timeout_s=TINY_S):
        seen.append(chunk)
        done.wait(TINY_S * 1.5)  # the consumer works longer than the idle timeout
    # Then no timeout: the stream itself always answered at once
    assert seen == [0, 1, 2]


def test_breaking_out_early_closes_the_stream() -> None:
    stream = BlockingStream(["a", "b", "c"])
    guarded = idle_guard(stream, idle_timeout_s=1.0)
    assert next(guarded) == "a"
    guarded.close()  # what a `break` does once the generator is dropped
    assert stream.closed.wait(2)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan")])
def test_bad_timeouts_are_refused(bad: float) -> None:
    with pytest.raises(ConfigError, match="idle_timeout_s"):
        idle_guard(iter([]), idle_timeout_s=bad)


def test_default_timeout_comes_from_the_agent_profile() -> None:
    settings = Settings(
        agents=AgentsSettings(list=(AgentOverride(id="slow", llm_idle_timeout_s=7.5),)),
    )
    assert default_idle_timeout_s("slow", settings) == 7.5
    assert default_idle_timeout_s("other", settings) == 90.0


def test_default_timeout_is_used_by_the_guard() -> None:
    settings = Settings(agents=AgentsSettings(list=(AgentOverride(id="a", llm_idle_timeout_s=TINY_S),)))
    stream = BlockingStream([])
    with pytest.raises(StreamIdleTimeout) as raised:
        list(idle_guard(stream, agent_id="a", settings=settings))
    stream.release.set()
    assert raised.value.idle_s == TINY_S


class HangingAsyncStream:
    """Async stream: yields ``chunks``, then awaits an event that never fires."""

    def __init__(self, chunks: list[str]) -> None:
        self.chunks = list(chunks)
        self.closed = False

    def __aiter__(self) -> AsyncIterator[str]:
        return self

    async def __anext__(self) -> str:
        if self.chunks:
            return self.chunks.pop(0)
        await asyncio.Event().wait()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed = True


async def test_async_stream_passes_every_chunk_through() -> None:
    async def chunks() -> AsyncIterator[int]:
        for i in range(3):
            yield i

    assert [c async for c in aidle_guard(chunks(), idle_timeout_s=1.0)] == [0, 1, 2]


async def test_async_stream_that_hangs_raises_idle_timeout_and_is_closed() -> None:
    # Given an async stream that stops sending after one chunk
    stream = HangingAsyncStream(["first"])
    guarded = aidle_guard(stream, idle_timeout_s=TINY_S)
    # When it is consumed through the guard
    first = await anext(guarded)
    with pytest.raises(StreamIdleTimeout):
        await anext(guarded)
    # Then the first chunk came through, and the stream was closed
    assert first == "first"
    assert stream.closed


async def test_async_stream_own_timeout_error_is_not_taken_for_idleness() -> None:
    async def chunks() -> AsyncIterator[str]:
        yield "a"
        raise TimeoutError("upstream read timeout")

    guarded = aidle_guard(chunks(), idle_timeout_s=1.0)
    assert await anext(guarded) == "a"
    with pytest.raises(TimeoutError, match="upstream read timeout") as raised:
        await anext(guarded)
    assert not isinstance(raised.value, StreamIdleTimeout)


class Reporter:
    """Records what a guard reports, as ``ToolGateway`` would store it."""

    def __init__(self) -> None:
        self.beats: list[tuple[str, str, str, str]] = []
        self.idles: list[tuple[str, str, float]] = []

    def heartbeat(
        self, session_key: str, run_id: str, *, agent_id: str = "main", what: str = "model"
    ) -> bool:
        self.beats.append((session_key, run_id, agent_id, what))
        return True

    def note_stream_idle(self, session_key: str, run_id: str, *, idle_timeout_s: float) -> None:
        self.idles.append((session_key, run_id, idle_timeout_s))


def test_sync_guard_heartbeats_the_run_per_chunk_and_records_idleness() -> None:
    # Given a guard reporting to a run
    reporter = Reporter()
    stream = BlockingStream(["a", "b"])
    guarded = idle_guard(stream, idle_timeout_s=TINY_S, gateway=reporter, session_key="s", run_id="r")
    # When two chunks arrive and then the stream goes quiet
    assert [next(guarded), next(guarded)] == ["a", "b"]
    with pytest.raises(StreamIdleTimeout):
        next(guarded)
    stream.release.set()
    # Then each chunk was a heartbeat of the run and the idle stream was recorded once
    assert reporter.beats == [("s", "r", "main", "model stream")] * 2
    assert reporter.idles == [("s", "r", TINY_S)]


async def test_async_guard_heartbeats_the_run_per_chunk_and_records_idleness() -> None:
    # Given an async stream that sends one chunk and then hangs
    reporter = Reporter()

    async def hangs() -> AsyncIterator[str]:
        yield "only"
        await asyncio.sleep(60)

    seen: list[str] = []

    async def consume() -> None:
        guarded = aidle_guard(hangs(), TINY_S, agent_id="a1", gateway=reporter, session_key="s", run_id="r")
        async for chunk in guarded:
            seen.append(chunk)

    # When it is guarded with a report target
    with pytest.raises(StreamIdleTimeout):
        await consume()
    # Then
    assert seen == ["only"]
    assert reporter.beats == [("s", "r", "a1", "model stream")]
    assert reporter.idles == [("s", "r", TINY_S)]


def test_a_report_target_needs_its_run() -> None:
    with pytest.raises(ConfigError, match="session_key"):
        idle_guard(iter(["a"]), 1.0, gateway=Reporter())
