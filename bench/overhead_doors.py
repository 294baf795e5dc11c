"""The other ways into unstuck that ``bench.overhead`` measures: asyncio, the HTTP door, the MCP door.

Each is a client of the same ``unstuck worker`` as the sync path, making the same no-op call:

* asyncio: ``ToolGateway.acall_tools`` on an event loop of the client's own; its throughput
  runs on one loop, the threads' worth of sessions as tasks of it (how an asyncio agent runs);
* HTTP: ``POST /v1/sessions/{s}/runs/r1/tool-calls`` to ``unstuck serve`` on one keep-alive
  connection per client;
* MCP: ``tools/call`` to ``unstuck mcp`` (Streamable HTTP), one MCP session per client.

A door's own process counts in the CPU per call (as ``door``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import threading
import time
from typing import Any

from mcp import Client

from tests.harness import UNSTUCK, Proc
from workers import ToolCall, ToolGateway
from workers.local.embedded_redis import free_port
from workers.settings import Settings

__all__ = [
    "AsyncGuarded",
    "HttpGuarded",
    "McpGuarded",
    "async_throughput",
    "start_http_door",
    "start_mcp_door",
]


def start_http_door(env: dict[str, str]) -> tuple[Proc, int]:
    """``unstuck serve`` on a free port, ready."""
    port = free_port()
    door = Proc([UNSTUCK, "serve", "--port", str(port)], env, "bench-serve")
    door.wait_for_log("Uvicorn running on", timeout_s=60)
    return door, port


def start_mcp_door(env: dict[str, str]) -> tuple[Proc, int]:
    """``unstuck mcp`` (Streamable HTTP) on a free port, ready."""
    port = free_port()
    door = Proc([UNSTUCK, "mcp", "--port", str(port)], env, "bench-mcp")
    door.wait_for_log("Streamable HTTP on", timeout_s=60)
    return door, port


class AsyncGuarded:
    """One session's calls through ``acall_tools``, on an event loop of this client's own."""

    def __init__(self, settings: Settings, session: str) -> None:
        self._gateway = ToolGateway(settings)
        self._session = session
        self._loop = asyncio.new_event_loop()

    async def call(self, n: int) -> None:
        """One no-op call on the running loop."""
        calls = [ToolCall(id=f"c{n}", name="noop")]
        (result,) = await self._gateway.acall_tools(session_key=self._session, run_id="r", calls=calls)
        assert result.text == "ok", result

    def __call__(self, n: int) -> None:
        self._loop.run_until_complete(self.call(n))

    def close(self) -> None:
        self._loop.run_until_complete(self._gateway.aclose())
        self._loop.close()


def async_throughput(settings: Settings, label: str, sessions: int, per_session: int) -> float:
    """Calls per second of ``sessions`` concurrent tasks on one loop and one gateway."""

    async def run() -> float:
        gateway = ToolGateway(settings)

        async def one(session: str, calls: int, first: int) -> None:
            for n in range(calls):
                call = ToolCall(id=f"c{first + n}", name="noop")
                (result,) = await gateway.acall_tools(session_key=session, run_id="r", calls=[call])
                assert result.text == "ok", result

        names = [f"{label}-{s}" for s in range(sessions)]
        await asyncio.gather(*(one(name, 1, 10_000_000) for name in names))  # connect first
        start = time.perf_counter()
        await asyncio.gather(*(one(name, per_session, 0) for name in names))
        elapsed = time.perf_counter() - start
        await gateway.aclose()
        return sessions * per_session / elapsed

    return asyncio.run(run())


class HttpGuarded:
    """One session's calls posted to ``unstuck serve`` on one keep-alive connection."""

    def __init__(self, port: int, session: str) -> None:
        self._conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self._path = f"/v1/sessions/{session}/runs/r1/tool-calls"

    def __call__(self, n: int) -> None:
        body = {"format": "neutral", "message": {"calls": [{"id": f"h{n}", "name": "noop", "arguments": {}}]}}
        self._conn.request("POST", self._path, json.dumps(body), {"Content-Type": "application/json"})
        response = self._conn.getresponse()
        data = response.read()
        assert response.status == 200, (response.status, data[:300])
        assert b'"ok"' in data, data[:300]

    def close(self) -> None:
        self._conn.close()


class McpGuarded:
    """One MCP session's ``tools/call`` of ``noop``, sequential, on an event loop of its own thread.

    The session is held by one task of that loop (anyio's scopes must close in the task that
    opened them); calls are handed to it one at a time.
    """

    def __init__(self, port: int) -> None:
        self._url = f"http://127.0.0.1:{port}/mcp"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="bench-mcp-client", daemon=True)
        self._thread.start()
        self._ready = threading.Event()
        self._requests: asyncio.Queue[concurrent.futures.Future[Any] | None] | None = None
        self._session = asyncio.run_coroutine_threadsafe(self._hold(), self._loop)
        if not self._ready.wait(60):
            raise TimeoutError(f"no MCP session with {self._url}: {self._session}")

    async def _hold(self) -> None:
        requests: asyncio.Queue[concurrent.futures.Future[Any] | None] = asyncio.Queue()
        self._requests = requests
        async with Client(self._url, read_timeout_seconds=60) as client:
            self._ready.set()
            while (future := await requests.get()) is not None:
                try:
                    future.set_result(await client.call_tool("noop", {}))
                except Exception as exc:  # noqa: BLE001 - handed to the caller
                    future.set_exception(exc)

    def _hand(self, item: concurrent.futures.Future[Any] | None) -> None:
        assert self._requests is not None
        self._loop.call_soon_threadsafe(self._requests.put_nowait, item)

    def __call__(self, n: int) -> None:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._hand(future)
        result = future.result(timeout=60)
        assert not result.is_error, result

    def close(self) -> None:
        self._hand(None)
        self._session.result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()
