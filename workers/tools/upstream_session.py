"""One live MCP client session to one upstream server, kept between calls.

The session lives on an event loop in a daemon thread of the process that calls (a worker's
pool child), so the blocking tool function waits on a future: the pool's soft-limit interrupt
reaches it there, cancels the upstream request (``notifications/cancelled``) and the session
stays up for the next call. A stdio upstream runs in a process group of its own, whose id the
caller records with the call: when a call ends hard (its pool child killed at the hard limit,
or a cancel), the worker kills that group and the next call starts the upstream again.

Failures, as the caller sees them:

- the upstream process exits during a call: :class:`UpstreamCrashed`; the next call restarts
  it after a backoff (doubling from 0.5 s to 10 s while it keeps dying);
- a call interrupted by its limit is followed by a ping; an upstream that does not answer it
  within :data:`PING_TIMEOUT_S` is wedged: its process group is killed, restarted on next use;
- an upstream that cannot start, or a remote one that cannot be reached:
  :class:`UpstreamUnavailable`, with the command (or URL) and the end of its stderr;
- an ``isError`` result: :class:`UpstreamToolError` with the upstream's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import IO, Any, Final, TypeVar

import anyio
import httpx2
import mcp_types as types
import psutil
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream
from mcp import Client
from mcp.client._transport import TransportStreams
from mcp.client.sse import sse_client
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

from workers.core.mcp_upstreams import RemoteUpstream, StdioUpstream, Upstream
from workers.errors import ToolCrashed, ToolExecutionError
from workers.tools import upstream_reaper

__all__ = [
    "PING_TIMEOUT_S",
    "CallCancelled",
    "UpstreamCrashed",
    "UpstreamSession",
    "UpstreamToolError",
    "UpstreamUnavailable",
]

log = logging.getLogger(__name__)

PING_TIMEOUT_S: Final = 2.0
START_TIMEOUT_S: Final = 30.0  # npx may fetch a package on a first start
_STDERR_TAIL_BYTES: Final = 2000
_TASK_TTL_MS: Final = 3_600_000
_CANCEL_POLL_S: Final = 0.25
_CLOSE_WAIT_S: Final = 2.0  # a closing session's tasks get this long to end
_BACKOFF_FIRST_S: Final = 0.5
_BACKOFF_MAX_S: Final = 10.0
T = TypeVar("T")


class UpstreamUnavailable(ToolExecutionError):
    """The upstream could not be started or reached; the message says which and why."""


class UpstreamCrashed(ToolCrashed):
    """The upstream's process ended while the call was in flight: the call is answered ``crashed``."""


class UpstreamToolError(ToolExecutionError):
    """The upstream answered the call with ``isError``: a tool error with the upstream's text."""


def _backoff_s(deaths: int) -> float:
    """Before the restart after death number ``deaths``: none after the first, then doubling."""
    return 0.0 if deaths <= 1 else float(min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** (deaths - 2)))


class UpstreamSession:
    """A client session to ``upstream`` on a private event loop; every method is thread-safe."""

    def __init__(self, upstream: Upstream, *, on_tools_changed: Callable[[], None] | None = None) -> None:
        self.upstream = upstream
        self._on_tools_changed = on_tools_changed
        self._lock = threading.RLock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Client | None = None
        self._stop: asyncio.Event | None = None
        self._process: Process | None = None
        self._stderr: IO[bytes] | None = None
        self._deaths = 0
        self._died_at = 0.0
        self._starting: threading.Event | None = None
        self._start_error = ""

    # -- life cycle -------------------------------------------------------------------------

    @property
    def pgid(self) -> int | None:
        """The process group of a running stdio upstream (None: remote, or not running)."""
        process = self._process
        return process.pid if process is not None and process.returncode is None else None

    def alive(self) -> bool:
        """Whether the session is up (a stdio upstream's process still running)."""
        if self._client is None:
            return False
        process = self._process
        return process is None or process.returncode is None

    def stderr_tail(self) -> str:
        """The end of the upstream's stderr (stdio only)."""
        handle = self._stderr
        if handle is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            size = os.fstat(handle.fileno()).st_size
            data = os.pread(handle.fileno(), _STDERR_TAIL_BYTES, max(0, size - _STDERR_TAIL_BYTES))
            return data.decode(errors="replace").strip()
        return ""

    def ensure_started(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the session unless it is up, and wait for it (at most ``timeout_s``).

        The start runs in a thread of its own, so a caller interrupted while it waits (its soft
        limit) leaves it to finish for the next call. A restart after a death waits out the
        backoff first: none after the first death, then 0.5 s doubling to 10 s.

        Raises:
            UpstreamUnavailable: it did not start within ``timeout_s``, or failed to.
        """
        with self._lock:
            if self.alive():
                return
            starting = self._starting
            if starting is None:
                if self._client is not None or self._process is not None:
                    self._note_death()
                starting = self._starting = threading.Event()
                threading.Thread(target=self._start_in_background, args=(starting,), daemon=True).start()
        starting.wait(timeout_s)
        if not self.alive():
            raise UpstreamUnavailable(self._start_error or f"MCP upstream {self.upstream.name} is starting")

    def restart_soon(self) -> None:
        """Start again in the background (after a death), so the next call finds it up."""
        threading.Thread(target=self._quiet_start, daemon=True).start()

    def _quiet_start(self) -> None:
        with contextlib.suppress(UpstreamUnavailable):
            self.ensure_started()

    def _start_in_background(self, done: threading.Event) -> None:
        try:
            wait_s = self._died_at + _backoff_s(self._deaths) - time.monotonic() if self._deaths else 0.0
            if wait_s > 0:
                time.sleep(wait_s)
            self._start_error = self._start(START_TIMEOUT_S)
        finally:
            with self._lock:
                self._starting = None
            done.set()

    def _note_death(self) -> None:
        self._deaths += 1
        self._died_at = time.monotonic()
        log.warning(
            "MCP upstream %s (%s) died; restarting after %.1fs",
            self.upstream.name,
            self.upstream.describe(),
            _backoff_s(self._deaths),
        )
        self._shutdown_loop()

    def _start(self, timeout_s: float) -> str:
        """Start the session; the reason it did not start ("" when it did)."""
        loop = asyncio.new_event_loop()
        name = f"mcp-upstream-{self.upstream.name}"
        threading.Thread(target=_run_loop, args=(loop,), name=name, daemon=True).start()
        self._loop = loop
        ready = asyncio.run_coroutine_threadsafe(self._serve(), loop)
        deadline = time.monotonic() + timeout_s
        while self._client is None and not ready.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._client is not None:
            log.info("MCP upstream %s started (pid %s)", self.upstream.name, self.pgid)
            return ""
        tail = self.stderr_tail()
        failure = _failure_text(ready)
        self.close()
        detail = f": {failure}" if failure else f" within {timeout_s:.0f}s"
        stderr = f"; stderr: {tail[-500:]}" if tail else ""
        which = f"MCP upstream {self.upstream.name} ({self.upstream.describe()})"
        message = f"{which} did not start{detail}{stderr}"
        log.warning("%s", message)
        return message

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with Client(
            self._transport(),
            read_timeout_seconds=None,
            message_handler=self._on_message,
            cache=None,
            mode="legacy",
        ) as client:
            self._client = client
            await self._stop.wait()

    def _transport(self) -> contextlib.AbstractAsyncContextManager[TransportStreams]:
        upstream = self.upstream
        if isinstance(upstream, StdioUpstream):
            return self._stdio(upstream)
        return _remote(upstream)

    @contextlib.asynccontextmanager
    async def _stdio(self, upstream: StdioUpstream) -> AsyncIterator[TransportStreams]:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - kept for the tail until close()
        process = await anyio.open_process(
            [upstream.command, *upstream.args],
            env=get_default_environment() | upstream.env,
            cwd=upstream.cwd,
            stderr=self._stderr,
            start_new_session=True,  # its own process group: killed as one when wedged
        )
        self._process = process
        upstream_reaper.note(process.pid)  # killed by the next pool child if this one dies hard
        _limit_memory(process.pid, upstream.unstuck.memory_limit_mb)
        try:
            async with _pipes(process) as streams:
                yield streams
        finally:
            with anyio.move_on_after(_CLOSE_WAIT_S, shield=True):
                await process.aclose()  # its group was killed: this reaps it and closes the pipes

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification) and self._on_tools_changed is not None:
            # Off the loop: the callback lists the tools again through this session.
            threading.Thread(target=self._on_tools_changed, daemon=True).start()

    def close(self) -> None:
        """End the session and kill a stdio upstream's process group."""
        self._shutdown_loop()

    def _shutdown_loop(self) -> None:
        self.kill()
        loop, stop = self._loop, self._stop
        if loop is not None:
            if stop is not None:
                loop.call_soon_threadsafe(stop.set)
            loop.call_soon_threadsafe(loop.stop)
        self._loop, self._client, self._stop, self._process = None, None, None, None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def kill(self) -> None:
        """Kill a stdio upstream's whole process group now (a wedged or stopping upstream)."""
        if self._process is not None:
            upstream_reaper.forget(self._process.pid)
        pgid = self.pgid
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)

    # -- requests ---------------------------------------------------------------------------

    def list_tools(self, timeout_s: float = START_TIMEOUT_S) -> list[types.Tool]:
        """The upstream's tools (every page)."""
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            try:
                page = self._run(functools.partial(self._list_page, cursor), timeout_s)
            except (_RequestFailed, TimeoutError) as exc:
                raise UpstreamUnavailable(
                    f"MCP upstream {self.upstream.name}: tools/list failed: {exc}"
                ) from None
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def _list_page(self, cursor: str | None) -> types.ListToolsResult:
        return await self._client_now().list_tools(cursor=cursor)

    def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        on_progress: Callable[[float, float | None, str | None], None] | None = None,
        as_task: bool = False,
        cancelled: Callable[[], bool] | None = None,
    ) -> types.CallToolResult:
        """Call ``tool``, blocking until the upstream answers (the caller's limits bound it).

        ``as_task``: the tool requires MCP Tasks (2025-11-25): the call is task-augmented,
        polled with ``tasks/get`` (its status messages relayed as progress) and its result
        fetched with ``tasks/result``; an interrupted call's task gets ``tasks/cancel``.
        ``cancelled`` is polled while the call runs: once true, the upstream gets
        ``notifications/cancelled`` (the session stays up) and :class:`CallCancelled` is raised.

        Raises:
            UpstreamCrashed: the upstream's process ended during the call.
            UpstreamUnavailable: a remote upstream cannot be reached.
            UpstreamToolError: the upstream answered ``isError``.
        """
        progress = _ProgressRelay(on_progress)
        if as_task:
            call = functools.partial(self._call_as_task, tool, arguments, progress)
        else:
            call = functools.partial(
                self._client_now().call_tool, tool, arguments, progress_callback=progress
            )
        try:
            result = self._run(call, None, cancelled=cancelled)
        except _RequestFailed as failed:
            raise self._failure(failed.cause) from None
        except BaseException:  # the soft limit (billiard's derives from Exception) or a cancel
            self._check_wedged()
            raise
        if result.is_error:
            raise UpstreamToolError(_text(result) or "the upstream reported an error")
        return result

    async def _call_as_task(
        self, tool: str, arguments: dict[str, Any], progress: _ProgressRelay
    ) -> types.CallToolResult:
        # The pinned SDK's client has no Tasks API: the raw requests, on its dispatcher.
        dispatcher = self._client_now().session._dispatcher
        params = {"name": tool, "arguments": arguments, "task": {"ttl": _TASK_TTL_MS}}
        created = await dispatcher.send_raw_request("tools/call", params)
        task_id = str(created["task"]["taskId"])
        try:
            polls = 0
            while True:
                task = await dispatcher.send_raw_request("tasks/get", {"taskId": task_id})
                if task.get("status") not in ("working", "input_required"):
                    break
                polls += 1
                await progress(polls, None, task.get("statusMessage"))
                await asyncio.sleep(min(5000, int(task.get("pollInterval") or 500)) / 1000)
            raw = await dispatcher.send_raw_request("tasks/result", {"taskId": task_id})
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(dispatcher.send_raw_request("tasks/cancel", {"taskId": task_id}))
            raise
        return types.CallToolResult.model_validate(raw, by_name=False)

    def _failure(self, exc: BaseException) -> Exception:
        process = self._process
        if process is not None:
            time.sleep(0.05)  # the process's exit status arrives just after its pipe closes
        if process is not None and (process.returncode is not None or not _running(process.pid)):
            tail = self.stderr_tail()
            detail = f"; stderr: {tail[-300:]}" if tail else ""
            code = process.returncode
            self.restart_soon()
            return UpstreamCrashed(
                f"MCP upstream {self.upstream.name} exited during the call (code {code}){detail}"
            )
        if isinstance(self.upstream, RemoteUpstream):
            where = f"MCP upstream {self.upstream.name} at {self.upstream.url}"
            return UpstreamUnavailable(f"{where} failed: {type(exc).__name__}: {exc}")
        return ToolExecutionError(f"MCP upstream {self.upstream.name}: {type(exc).__name__}: {exc}")

    def _check_wedged(self) -> None:
        """After an interrupted call: kill the upstream if it no longer answers a ping."""
        try:
            self._run(self._ping, PING_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - no answer in time is the finding
            log.warning("MCP upstream %s does not answer a ping: killing it", self.upstream.name)
            self.kill()
            self.restart_soon()

    async def _ping(self) -> dict[str, Any]:
        # Raw: the SDK's send_ping warns that 2026-07-28 dropped ping; upstreams speak 2025-11-25.
        return await self._client_now().session._dispatcher.send_raw_request("ping", None)

    def _client_now(self) -> Client:
        client = self._client
        if client is None:
            raise UpstreamCrashed(f"MCP upstream {self.upstream.name} is not running")
        return client

    def _run(
        self,
        make: Callable[[], Coroutine[Any, Any, T]],
        timeout_s: float | None,
        *,
        cancelled: Callable[[], bool] | None = None,
    ) -> T:
        loop = self._loop
        if loop is None:
            raise UpstreamCrashed(f"MCP upstream {self.upstream.name} is not running")
        future = asyncio.run_coroutine_threadsafe(make(), loop)
        try:
            if cancelled is not None:
                _wait_unless(future, cancelled)
            return future.result(timeout_s)
        except BaseException as exc:
            if future.done() and not future.cancelled() and future.exception() is exc:
                raise _RequestFailed(exc) from exc
            # Interrupted (the soft limit, a timeout): the SDK sends notifications/cancelled.
            future.cancel()
            raise


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    """A session's event loop until it is stopped; then its tasks are ended and it is closed."""
    try:
        loop.run_forever()
    finally:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            with contextlib.suppress(Exception):
                loop.run_until_complete(asyncio.wait(pending, timeout=_CLOSE_WAIT_S))
        loop.close()


class CallCancelled(Exception):
    """The call was cancelled by its caller; the upstream was told with ``notifications/cancelled``."""


def _wait_unless(future: Any, cancelled: Callable[[], bool]) -> None:
    """Wait for ``future``; raise :class:`CallCancelled` once ``cancelled()`` says so.

    The first look at ``cancelled`` comes after a quarter second: a quick call costs no check.
    """
    while not future.done():
        with contextlib.suppress(TimeoutError):
            future.result(_CANCEL_POLL_S)
            return
        if cancelled():
            raise CallCancelled


class _RequestFailed(Exception):
    """The request itself failed (not interrupted): ``cause`` is why."""

    def __init__(self, cause: BaseException) -> None:
        self.cause = cause
        super().__init__(f"{type(cause).__name__}: {cause}")


class _ProgressRelay:
    """The upstream's ``notifications/progress`` for one call, handed to a plain callback."""

    def __init__(self, callback: Callable[[float, float | None, str | None], None] | None) -> None:
        self._callback = callback

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        if self._callback is not None:
            self._callback(progress, total, message)


@contextlib.asynccontextmanager
async def _pipes(process: Process) -> AsyncIterator[TransportStreams]:
    """Newline-delimited JSON-RPC over the process's stdin/stdout; the read side ends with it."""
    reading, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    write_stream, writing = anyio.create_memory_object_stream[SessionMessage](16)

    async def read() -> None:
        assert process.stdout is not None
        async with reading:
            buffer = ""
            async for chunk in TextReceiveStream(process.stdout, errors="replace"):
                *lines, buffer = (buffer + chunk).split("\n")
                for line in lines:
                    if line.strip():
                        await reading.send(_parse(line))

    async def write() -> None:
        assert process.stdin is not None
        async with writing:
            async for message in writing:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    await process.stdin.send(data.encode())

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read)
        tasks.start_soon(write)
        try:
            yield read_stream, write_stream
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            tasks.cancel_scope.cancel()


def _parse(line: str) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


def _remote(upstream: RemoteUpstream) -> contextlib.AbstractAsyncContextManager[TransportStreams]:
    if upstream.transport == "sse":
        return sse_client(upstream.url, headers=dict(upstream.headers))
    http = httpx2.AsyncClient(headers=dict(upstream.headers), timeout=httpx2.Timeout(30.0, read=None))
    return streamable_http_client(upstream.url, http_client=http)


def _limit_memory(pid: int, limit_mb: int | None) -> None:
    """Cap a stdio upstream's data segment (``RLIMIT_DATA``): past it, its allocations fail.

    The entry's ``memory_limit_mb`` bounds the upstream's own process, which outlives every
    call; a tool's bounds the pool child during its calls, as for any tool.
    """
    if not limit_mb:
        return
    limit = limit_mb * 1024 * 1024
    with contextlib.suppress(psutil.Error, OSError, ValueError):
        psutil.Process(pid).rlimit(psutil.RLIMIT_DATA, (limit, limit))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0): read its state where /proc tells it.
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _failure_text(future: asyncio.Future[None] | Any) -> str:
    if not future.done() or future.cancelled():
        return ""
    exc = future.exception()
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if exc is not None else "it closed the connection"


def _text(result: types.CallToolResult) -> str:
    parts = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        else:
            parts.append(block.model_dump_json(by_alias=True, exclude_none=True))
    return "\n".join(parts)
