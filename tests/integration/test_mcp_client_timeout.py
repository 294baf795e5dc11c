"""The MCP door answers every call before the client gives up (``mcp.client_timeout_s``).

The door runs in this process (the SDK's in-memory client), its calls on a real worker; the
client's timeout is 3 s here, the door's margin 0.5 s: a call still running at 2.5 s is
answered ``still_running``, the tool runs on, and ``unstuck_result`` fetches its late result.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
import mcp_types as types
import pytest
from mcp import Client

from tests.harness import UNSTUCK, Proc, base_env, wait_until
from workers.servers.mcp_server import McpDoor
from workers.settings import Settings
from workers.store.ledger import Ledger

CLIENT_TIMEOUT_S = 3.0
MARGIN_S = 0.5
ANSWER_WITHIN_S = CLIENT_TIMEOUT_S - MARGIN_S
SESSION = "mcp:stdio-timeout-test"


@pytest.fixture
def env(redis_url: str) -> dict[str, str]:
    return base_env(
        redis_url,
        UNSTUCK_MCP__CLIENT_TIMEOUT_S=str(CLIENT_TIMEOUT_S),
        UNSTUCK_MCP__ANSWER_MARGIN_S=str(MARGIN_S),
    )


@pytest.fixture
async def door(settings: Settings, worker: Proc) -> AsyncIterator[McpDoor]:
    door = McpDoor.from_settings(settings, stdio_session="stdio-timeout-test", progress_every_s=0.5)
    yield door
    await door.aclose()


def _text(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


def _details(result: types.CallToolResult) -> dict[str, Any]:
    assert result.meta is not None
    return cast(dict[str, Any], result.meta["unstuck/details"])


def _ledger_answer(ledger: Ledger, result: types.CallToolResult) -> str:
    assert result.meta is not None
    keys = ledger.keys(result.meta["unstuck/session"], result.meta["unstuck/run"])
    record = ledger.record(keys, result.meta["unstuck/call"])
    assert record is not None
    assert record.result is not None
    return "\n".join(block.text for block in record.result.content)


@pytest.mark.timeout(60)
async def test_a_call_longer_than_the_client_waits_is_answered_before_it(door: McpDoor) -> None:
    async with Client(door.server(), read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
        # When a healthy tool takes 4 s, inside its own limits but past the client's 3 s
        started = time.monotonic()
        answer = await client.call_tool("slow", {"seconds": 4})
        answered_s = time.monotonic() - started
        call_id = _details(answer)["call_id"]
        # ... and the model asks for its result with the call id it was given
        fetched = await client.call_tool("unstuck_result", {"call_id": call_id})
        fetched_s = time.monotonic() - started
        again = await client.call_tool("unstuck_result", {"call_id": call_id})
        unknown = await client.call_tool("unstuck_result", {"call_id": "never-was"})
    print(f"\nstill_running after {answered_s:.2f}s, late result fetched after {fetched_s:.2f}s")
    # Then the door answered before the client's timeout, still_running, naming the call
    assert ANSWER_WITHIN_S <= answered_s < CLIENT_TIMEOUT_S
    assert answer.is_error
    assert _details(answer)["reason"] == "still_running"
    assert f'"call_id": "{call_id}"' in _text(answer)
    assert "unstuck_result" in _text(answer)
    # ... the ledger holds exactly that answer as the call's one result
    assert _ledger_answer(door.ledger, answer) == _text(answer)
    # ... the tool ran on and its own result is fetched (waiting for it), also twice
    assert (fetched.is_error, _text(fetched)) == (False, "slow done")
    assert fetched_s < 4 + 1.5
    assert _details(fetched)["result_of"] == call_id
    assert _text(again) == "slow done"
    assert _ledger_answer(door.ledger, fetched) == "slow done"
    # ... and an id the door never answered still_running is refused, not waited on
    assert unknown.is_error
    assert "No call 'never-was'" in _text(unknown)


@pytest.mark.timeout(60)
async def test_a_result_not_ready_within_the_wait_is_still_running_again(door: McpDoor) -> None:
    async with Client(door.server(), read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
        answer = await client.call_tool("slow", {"seconds": 7})
        started = time.monotonic()
        not_yet = await client.call_tool("unstuck_result", {"call_id": _details(answer)["call_id"]})
        waited_s = time.monotonic() - started
    assert _details(not_yet)["reason"] == "still_running"
    assert "again later" in _text(not_yet)
    assert ANSWER_WITHIN_S <= waited_s < CLIENT_TIMEOUT_S


@pytest.mark.timeout(60)
async def test_a_silent_call_reports_progress_and_a_quick_one_is_answered_as_ever(door: McpDoor) -> None:
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    # (legacy mode: JSON-RPC in memory, so the request carries a progressToken as on a wire)
    async with Client(door.server(), mode="legacy", read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        slow = await client.call_tool("slow", {"seconds": 2}, progress_callback=on_progress)
        echo = await client.call_tool("echo", {"text": "hi"})
    assert "unstuck_result" in tools
    assert _text(slow) == "slow done"
    assert _text(echo) == "hi"
    assert len(seen) >= 2
    assert [value for value, _ in seen] == list(range(1, len(seen) + 1))
    assert all(message is not None and message.startswith("running for") for _, message in seen), seen


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _call_message(call_id: str) -> dict[str, Any]:
    meta = {"unstuck/session": "hang-up", "unstuck/run": "r1", "unstuck/call": call_id}
    params = {"name": "slow", "arguments": {"seconds": 20}, "_meta": meta}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def _reason(ledger: Ledger, call_id: str) -> str | None:
    record = ledger.record(ledger.keys("hang-up", "r1"), call_id)
    return None if record is None or record.result is None else record.result.reason


@pytest.mark.timeout(60)
def test_an_http_client_that_hangs_up_cancels_its_call(
    env: dict[str, str], worker: Proc, ledger: Ledger
) -> None:
    # Given the door on Streamable HTTP and a session with a 20 s call running
    port = _free_port()
    door = Proc([UNSTUCK, "mcp", "--port", str(port)], env, "mcp-hang-up")
    try:
        door.wait_for_log("Streamable HTTP on", timeout_s=30)
        url = f"http://127.0.0.1:{port}/mcp"
        accept = {"Accept": "application/json, text/event-stream"}
        with httpx.Client(timeout=30) as http:
            session = http.post(url, headers=accept, json=INITIALIZE).headers["mcp-session-id"]
            headers = {**accept, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
            http.post(url, headers=headers, json=INITIALIZED)
            with http.stream("POST", url, headers=headers, json=_call_message("c1")) as response:
                assert response.status_code == 200
                wait_until(
                    lambda: ledger.record(ledger.keys("hang-up", "r1"), "c1") is not None, timeout_s=10
                )
            # When the client closes the response stream without a notifications/cancelled
        hung_up = time.monotonic()
        # Then the door answers the call cancelled at once
        wait_until(lambda: _reason(ledger, "c1") is not None, timeout_s=5, what="cancel answer")
        print(f"\nhang-up answered cancelled after {time.monotonic() - hung_up:.2f}s")
        assert _reason(ledger, "c1") == "cancelled"
    finally:
        door.kill()


def _stdio_door_with_a_call(env: dict[str, str], ledger: Ledger, call_id: str) -> subprocess.Popen[str]:
    server = subprocess.Popen(
        [UNSTUCK, "mcp", "--stdio"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    assert server.stdin is not None
    assert server.stdout is not None
    for message in (INITIALIZE, INITIALIZED, _call_message(call_id)):
        server.stdin.write(json.dumps(message) + "\n")
        server.stdin.flush()
        if message is INITIALIZE:
            assert json.loads(server.stdout.readline())["id"] == 0
    wait_until(lambda: ledger.record(ledger.keys("hang-up", "r1"), call_id) is not None, timeout_s=10)
    return server


@pytest.mark.timeout(60)
def test_a_stdio_client_that_closes_stdin_cancels_its_call(
    env: dict[str, str], worker: Proc, ledger: Ledger
) -> None:
    server = _stdio_door_with_a_call(env, ledger, "c2")
    assert server.stdin is not None
    assert server.stdout is not None
    server.stdin.close()
    assert server.wait(timeout=30) == 0
    server.stdout.close()
    assert _reason(ledger, "c2") == "cancelled"


@pytest.mark.timeout(60)
def test_a_stdio_door_signalled_to_stop_cancels_its_call(
    env: dict[str, str], worker: Proc, ledger: Ledger
) -> None:
    # Given a stdio door with a call open, when its host stops it with SIGTERM
    server = _stdio_door_with_a_call(env, ledger, "c3")
    server.send_signal(signal.SIGTERM)
    # Then the door answers the call cancelled before it exits
    assert server.wait(timeout=30) == 0
    for stream in (server.stdin, server.stdout):
        assert stream is not None
        stream.close()
    assert _reason(ledger, "c3") == "cancelled"
