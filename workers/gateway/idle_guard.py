"""Idle guard for a model's token stream: no chunk within ``idle_timeout_s`` → ``StreamIdleTimeout``.

The agent loop's own model calls must not hang either. Wrap the stream an SDK returns::

    for chunk in idle_guard(client.stream(...), agent_id="main"):
        ...
    async for chunk in aidle_guard(await aclient.stream(...), idle_timeout_s=30):
        ...

The timeout counts from the moment the consumer asks for the next chunk until it arrives;
time the consumer spends on a chunk is not idle time. The default comes from
``agents.defaults.llm.idleTimeoutSeconds`` (or the agent's own ``llm.idleTimeoutSeconds``).

**Sync streams** are pulled by a background daemon thread, one chunk per request, so a
``next()`` blocked on a dead socket is noticed. Python cannot kill a thread: after a
timeout that producer thread is *abandoned*, not killed. It stays blocked inside the
stream until the stream itself returns or fails, then closes the stream and exits. Pass
``on_idle`` (for example the HTTP response's ``close``) to unblock it sooner.

**Async streams** are awaited chunk by chunk under :func:`asyncio.wait_for`; on timeout the
pending ``__anext__`` is cancelled and the stream's ``aclose()`` is awaited (bounded).

**The watchdog sees the model.** Pass ``gateway=``, ``session_key=`` and ``run_id=``: every
chunk then calls ``gateway.heartbeat`` (at most one store write per second), so a run whose
model streams for minutes without a tool call stays ``active``, and a stream that goes idle
is recorded on the run (``stream_idle_n``, an event) before ``StreamIdleTimeout`` is raised.
In an async guard the heartbeat is a short synchronous Redis write, once a second at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import threading
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Generator,
    Iterable,
    Iterator,
)
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

from workers.errors import ConfigError, StreamIdleTimeout
from workers.settings import Settings, load_settings

__all__ = ["RunReporter", "aidle_guard", "default_idle_timeout_s", "idle_guard"]

T = TypeVar("T")

_END: Final = object()


@dataclass(frozen=True)
class _Failure:
    """An exception raised by the stream, carried from the producer thread to the consumer."""

    error: BaseException


def default_idle_timeout_s(agent_id: str = "main", settings: Settings | None = None) -> float:
    """The configured idle timeout of ``agent_id`` (``llm.idle_timeout_s``)."""
    return (settings or load_settings()).agents.for_agent(agent_id).llm.idle_timeout_s


def _resolve_timeout_s(idle_timeout_s: float | None, agent_id: str, settings: Settings | None) -> float:
    value = default_idle_timeout_s(agent_id, settings) if idle_timeout_s is None else idle_timeout_s
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ConfigError([("idle_timeout_s", f"must be a positive finite number of seconds, not {value!r}")])
    return float(value)


class RunReporter(Protocol):
    """What the guards tell about a run: ``ToolGateway`` is one."""

    def heartbeat(self, session_key: str, run_id: str, *, agent_id: str = ..., what: str = ...) -> bool:
        """The agent works on the run."""
        ...

    def note_stream_idle(self, session_key: str, run_id: str, *, idle_timeout_s: float) -> None:
        """A model stream of the run went idle."""
        ...


@dataclass(frozen=True)
class _Report:
    """Where a guard reports chunks and idleness (nowhere when ``reporter`` is None)."""

    reporter: RunReporter | None
    session_key: str
    run_id: str
    agent_id: str

    def chunk(self) -> None:
        if self.reporter is not None:
            self.reporter.heartbeat(
                self.session_key, self.run_id, agent_id=self.agent_id, what="model stream"
            )

    def idle(self, timeout_s: float) -> None:
        if self.reporter is not None:
            self.reporter.note_stream_idle(self.session_key, self.run_id, idle_timeout_s=timeout_s)


def _report(gateway: RunReporter | None, session_key: str, run_id: str, agent_id: str) -> _Report:
    if gateway is not None and not (session_key and run_id):
        raise ConfigError([("idle_guard", "gateway= needs session_key= and run_id= to report to")])
    return _Report(gateway, session_key, run_id, agent_id)


class _Pump:
    """Owns the stream in a daemon thread; pulls one chunk each time the consumer asks."""

    def __init__(self, iterator: Iterator[Any]) -> None:
        self._iterator = iterator
        self._demand = threading.Semaphore(0)
        self._stopped = threading.Event()
        self._out: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="unstuck-idle-guard", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while self._demand.acquire() and not self._stopped.is_set():
                try:
                    item = next(self._iterator)
                except StopIteration:
                    self._out.put(_END)
                    return
                except BaseException as exc:  # noqa: BLE001 - handed to the consumer, re-raised there
                    self._out.put(_Failure(exc))
                    return
                self._out.put(item)
        finally:
            self._close_source()

    def _close_source(self) -> None:
        close = getattr(self._iterator, "close", None)
        if callable(close):
            # The consumer is gone or the stream ended: a failure to close has no one to go to.
            with contextlib.suppress(Exception):
                close()

    def next(self, timeout_s: float) -> Any:
        """The next chunk, ``_END``, or raise the stream's error; ``queue.Empty`` on timeout."""
        self._demand.release()
        item = self._out.get(timeout=timeout_s)
        if isinstance(item, _Failure):
            raise item.error
        return item

    def stop(self) -> None:
        """Tell the thread to close the stream and exit as soon as it is not inside ``next()``."""
        self._stopped.set()
        self._demand.release()

    @property
    def alive(self) -> bool:
        """Whether the producer thread still runs (blocked in the stream or about to exit)."""
        return self._thread.is_alive()


def idle_guard(
    stream: Iterable[T],
    idle_timeout_s: float | None = None,
    *,
    agent_id: str = "main",
    settings: Settings | None = None,
    on_idle: Callable[[], object] | None = None,
    gateway: RunReporter | None = None,
    session_key: str = "",
    run_id: str = "",
) -> Generator[T, None, None]:
    """Yield ``stream``'s chunks; raise ``StreamIdleTimeout`` when one takes over ``idle_timeout_s``.

    Args:
        stream: any iterable of chunks (an SDK's sync stream).
        idle_timeout_s: longest wait for one chunk; default from the agent's settings.
        agent_id: whose ``llm.idle_timeout_s`` is the default.
        settings: settings to read the default from (default: the environment).
        on_idle: called once on timeout, e.g. to close the connection the stream blocks on.
        gateway: a ``ToolGateway`` to heartbeat the run on every chunk and record idleness.
        session_key: the run's session (with ``gateway``).
        run_id: the run (with ``gateway``).

    Raises:
        StreamIdleTimeout: when no chunk arrives in time (the producer thread is abandoned).
        ConfigError: when the timeout is not a positive finite number, or ``gateway`` comes
            without ``session_key`` and ``run_id``.
    """
    timeout_s = _resolve_timeout_s(idle_timeout_s, agent_id, settings)
    report = _report(gateway, session_key, run_id, agent_id)
    return _guarded(iter(stream), timeout_s, on_idle, report)


def _guarded(
    iterator: Iterator[T], timeout_s: float, on_idle: Callable[[], object] | None, report: _Report
) -> Generator[T, None, None]:
    pump = _Pump(iterator)
    try:
        while True:
            try:
                item = pump.next(timeout_s)
            except queue.Empty:
                _call_quietly(on_idle)
                report.idle(timeout_s)
                raise StreamIdleTimeout(timeout_s) from None
            if item is _END:
                return
            report.chunk()
            yield item
    finally:
        pump.stop()


def _call_quietly(callback: Callable[[], object] | None) -> None:
    if callback is not None:
        # Best effort to unblock the abandoned producer; the timeout is raised regardless.
        with contextlib.suppress(Exception):
            callback()


async def aidle_guard(
    stream: AsyncIterable[T],
    idle_timeout_s: float | None = None,
    *,
    agent_id: str = "main",
    settings: Settings | None = None,
    gateway: RunReporter | None = None,
    session_key: str = "",
    run_id: str = "",
) -> AsyncGenerator[T, None]:
    """Yield ``stream``'s chunks; raise ``StreamIdleTimeout`` when one takes over ``idle_timeout_s``.

    ``gateway``, ``session_key`` and ``run_id`` report to the run as :func:`idle_guard` does.

    Raises:
        StreamIdleTimeout: when no chunk arrives in time; the stream is then closed.
        ConfigError: when the timeout is not a positive finite number, or ``gateway`` comes
            without ``session_key`` and ``run_id``.
    """
    timeout_s = _resolve_timeout_s(idle_timeout_s, agent_id, settings)
    report = _report(gateway, session_key, run_id, agent_id)
    iterator = aiter(stream)
    try:
        while True:
            try:
                item = await asyncio.wait_for(_anext_boxed(iterator), timeout_s)
            except TimeoutError:
                report.idle(timeout_s)
                raise StreamIdleTimeout(timeout_s) from None
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.error
            report.chunk()
            yield item
    finally:
        await _aclose_quietly(iterator, timeout_s)


async def _anext_boxed(iterator: AsyncIterator[Any]) -> Any:
    """The next chunk, ``_END``, or the stream's own ``TimeoutError`` boxed apart from ours."""
    try:
        return await anext(iterator)
    except StopAsyncIteration:
        return _END
    except TimeoutError as exc:
        return _Failure(exc)


async def _aclose_quietly(iterator: AsyncIterator[Any], timeout_s: float) -> None:
    aclose = getattr(iterator, "aclose", None)
    if not callable(aclose):
        return
    # Closing a stream that already failed or hung must neither hang nor mask the real error.
    with contextlib.suppress(Exception):
        await asyncio.wait_for(aclose(), timeout_s)
