"""``unstuck mcp`` end to end: the official MCP SDKs against a real door, worker, watchdog and beat.

The module's tests share one redis-server, tool worker, watchdog, beat and ``unstuck mcp``
(subprocesses), each test in sessions of its own. The Python SDK's client speaks the
2026-07-28 (sessionless) protocol by default and the handshake era with ``mode="legacy"``;
the TypeScript SDK (``tests/e2e/mcp_ts``, run by Node) speaks the handshake era over
Streamable HTTP. Limits of the misbehaving tools:
``stubborn`` soft 1 s, hard 2 s (ignores the soft limit); ``sleepy`` soft 1 s.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.e2e.conftest import Processes
from tests.harness import UNSTUCK, Proc, base_env, settings_in_env, wait_until
from workers.local.embedded_redis import EmbeddedRedis
from workers.runtime import open_ledger
from workers.store.ledger import Ledger
from workers.store.sessions import SessionStore

pytestmark = [pytest.mark.slow]

TS_DIR = Path(__file__).parent / "mcp_ts"
STUBBORN_HARD_S = 2.0
SLEEPY_SOFT_S = 1.0
ANSWER_SLACK_S = 1.5  # a limit's answer reaches the client within this
CLIENT_TIMEOUT_S = 60.0  # far beyond every limit: an answer by the limit is unstuck's
RUN_IDLE_S = 2.0
STALLED_AFTER_S = 1.0  # shorter than RUN_IDLE_S: a silent run between calls would look stuck
TOKEN = "mcp-e2e-token"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Door:
    """A running ``unstuck mcp`` and what a test needs to talk to it and read its ledger."""

    url: str
    env: dict[str, str]
    ledger: Ledger

    def reason(self, session: str, run: str, call: str) -> str | None:
        record = self.ledger.record(self.ledger.keys(session, run), call)
        return None if record is None or record.result is None else record.result.reason


def _start_door(env: dict[str, str], processes: Processes, name: str) -> str:
    port = _free_port()
    proc = processes.track(Proc([UNSTUCK, "mcp", "--port", str(port)], env, name))
    proc.wait_for_log("Streamable HTTP on", timeout_s=60)
    return f"http://127.0.0.1:{port}/mcp"


@pytest.fixture(scope="module")
def door() -> Iterator[Door]:
    """A tool worker, the watchdog, beat and the door on a private Redis, shared by the module.

    Starting the four processes costs a test about ten seconds on two cores; the tests keep
    to sessions of their own. The pool has twice the slots one test uses at once, so a tool a
    previous test left running (a cancelled call's) cannot hold back the next test's calls.
    """
    server = EmbeddedRedis().start()
    env = base_env(
        server.url,
        UNSTUCK_WATCHDOG__INTERVAL_S="1",
        UNSTUCK_API__MCP_RUN_IDLE_S=str(RUN_IDLE_S),
        UNSTUCK_WATCHDOG__STALLED_AFTER_S=str(STALLED_AFTER_S),
    )
    processes = Processes()
    with pytest.MonkeyPatch.context() as monkeypatch:
        try:
            watchdog = processes.track(
                Proc([UNSTUCK, "watchdog", "-n", "watchdog-mcp@%h"], env, "watchdog-mcp")
            )
            beat = processes.track(Proc([UNSTUCK, "beat"], env, "beat-mcp"))
            url = _start_door(env, processes, "mcp")
            processes.worker(env, name="mcp", concurrency=8)
            watchdog.wait_for_log(" ready.", timeout_s=60)
            beat.wait_for_log("beat: Starting", timeout_s=60)
            ledger = open_ledger(settings_in_env(env, monkeypatch))
            yield Door(url, env, ledger)
            ledger.close()
        finally:
            processes.close()
            server.close()


def _meta(values: dict[str, str]) -> types.RequestParamsMeta:
    """``_meta`` keys of unstuck (the SDK types the open map as a TypedDict)."""
    return cast(types.RequestParamsMeta, values)


def _details(result: types.CallToolResult) -> dict[str, Any]:
    assert result.meta is not None
    details: dict[str, Any] = result.meta["unstuck/details"]
    return details


def _text(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def _timed_calls(client: Client, calls: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Every call at once; name -> (seconds until answered, result)."""
    answers: dict[str, tuple[float, types.CallToolResult]] = {}

    async def one(key: str, tool: str, arguments: dict[str, Any]) -> None:
        started = time.monotonic()
        result = await client.call_tool(tool, arguments)
        answers[key] = (time.monotonic() - started, result)

    async with anyio.create_task_group() as tasks:
        for key, (tool, arguments) in calls.items():
            tasks.start_soon(one, key, tool, arguments)
    return answers


MISBEHAVING: dict[str, tuple[str, dict[str, Any]]] = {
    "echo": ("echo", {"text": "hi", "times": 2}),
    "stubborn": ("stubborn", {"seconds": 30}),
    "sleepy": ("sleepy", {"seconds": 30}),
    "crash": ("crash", {}),
    "unknown": ("ech0", {"text": "x"}),
    "malformed": ("echo", {"text": 5, "bogus": True}),
}


@pytest.mark.timeout(90)
async def test_python_sdk_every_call_is_answered_by_its_limit(door: Door) -> None:
    async with Client(door.url, read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
        # When the client lists the tools and calls every misbehaving one at once
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        answers = await _timed_calls(client, MISBEHAVING)
        protocol = client.protocol_version
    # Then the tools are listed with their argument schemas
    assert {"echo", "stubborn", "sleepy", "crash", "beating"} <= tools.keys()
    assert tools["echo"].input_schema["required"] == ["text"]
    # ... and every call is answered, the hung ones at their limit, not the client's timeout
    elapsed = {key: round(seconds, 2) for key, (seconds, _) in answers.items()}
    results = {key: result for key, (_, result) in answers.items()}
    print(f"\nMCP (Python SDK, {protocol}) answered after: {elapsed}")
    assert (results["echo"].is_error, _text(results["echo"])) == (False, "hihi")
    expected = {
        "stubborn": "timeout_hard",
        "sleepy": "timeout_soft",
        "crash": "crashed",
        "unknown": "unknown_tool",
        "malformed": "invalid_arguments",
    }
    assert {key: _details(results[key]).get("reason") for key in expected} == expected
    assert all(results[key].is_error for key in expected)
    assert STUBBORN_HARD_S <= elapsed["stubborn"] < STUBBORN_HARD_S + ANSWER_SLACK_S
    assert SLEEPY_SOFT_S <= elapsed["sleepy"] < SLEEPY_SOFT_S + ANSWER_SLACK_S
    assert "echo" in _text(results["unknown"])
    problems = " ".join(_details(results["malformed"])["problems"])
    assert "text" in problems
    assert "bogus" in problems


@pytest.mark.timeout(90)
async def test_python_sdk_heartbeats_become_progress_and_a_cancel_is_answered_cancelled_and_stops_the_tool(
    door: Door,
) -> None:
    where = _meta({"unstuck/session": "py-cancel", "unstuck/run": "r1", "unstuck/call": "c1"})
    seen: list[tuple[float, str | None]] = []
    running = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))
        running.set()

    async with Client(door.url, read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
        # When a heartbeating tool runs with a progress token
        beating = await client.call_tool(
            "beating", {"seconds": 1.5, "stop_beating_after": 1.5}, progress_callback=on_progress
        )
        beats = list(seen)
        # ... and another is cancelled by the client once its first heartbeat arrived
        running = anyio.Event()
        async with anyio.create_task_group() as tasks:

            async def doomed() -> None:
                await client.call_tool(
                    "beating",
                    {"seconds": 20, "stop_beating_after": 20},
                    progress_callback=on_progress,
                    meta=where,
                )

            tasks.start_soon(doomed)
            with anyio.fail_after(10):
                await running.wait()
            cancelled_at = time.monotonic()
            tasks.cancel_scope.cancel()
    # Then each heartbeat arrived as a progress notification with the tool's details
    assert _text(beating) == "finished"
    assert len(beats) >= 2
    assert [value for value, _ in beats] == list(range(1, len(beats) + 1))
    assert all(message and "progress" in message for _, message in beats)
    # ... and the cancelled call is answered `cancelled` in the ledger by the door
    wait_until(lambda: door.reason("py-cancel", "r1", "c1") is not None, timeout_s=5, what="cancel answer")
    print(f"\ncancel recorded {time.monotonic() - cancelled_at:.2f}s after the client cancelled")
    keys = door.ledger.keys("py-cancel", "r1")
    record = door.ledger.record(keys, "c1")
    assert record is not None
    assert door.reason("py-cancel", "r1", "c1") == "cancelled"
    assert record.fields["writer"].endswith("/mcp")
    # ... and the tool is stopped, as ToolGateway.cancel stops it: its worker ends it within the
    # cancel grace (5 s) and its own answer, cancelled too, is kept as late, never delivered; a
    # tool left to run would finish at 20 s, or be killed at its 25 s hard limit
    wait_until(lambda: bool(door.ledger.late_results(keys, "c1")), timeout_s=12, what="the worker's answer")
    stopped_after = time.monotonic() - cancelled_at
    print(f"tool stopped {stopped_after:.2f}s after the client cancelled")
    late = door.ledger.late_results(keys, "c1")
    assert {answer.reason for answer in late} == {"cancelled"}, late
    assert "finished" not in [answer.text for answer in late]
    assert door.reason("py-cancel", "r1", "c1") == "cancelled"


@pytest.mark.timeout(90)
async def test_a_session_shares_a_run_until_the_client_is_idle(door: Door) -> None:
    async with Client(door.url, mode="legacy", read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
        # When a handshake-era session calls twice, then names a run, then calls again
        first = await client.call_tool("echo", {"text": "a"})
        second = await client.call_tool("echo", {"text": "b"})
        named = await client.call_tool("echo", {"text": "c"}, meta=_meta({"unstuck/run": "mine"}))
        after_named = await client.call_tool("echo", {"text": "d"})
        # ... and then stays idle past api.mcp_run_idle_s
        assert first.meta is not None
        session, run = first.meta["unstuck/session"], first.meta["unstuck/run"]
        store = SessionStore(door.ledger)

        classes: set[str] = set()
        beats: set[str] = set()

        def ended(run_id: str) -> bool:
            info = store.run(session, run_id)
            if info is not None:
                classes.add(info.klass)
                beats.add(info.agent_beat_what)
            return info is not None and info.status == "completed"

        assert after_named.meta is not None
        idle_run = after_named.meta["unstuck/run"]
        wait_until(lambda: ended(idle_run), timeout_s=RUN_IDLE_S + 5, what="idle run ended")
        later = await client.call_tool("echo", {"text": "e"})
    # Then the MCP session is the unstuck session and its first calls shared one run
    assert session.startswith("mcp:")
    runs = [r.meta["unstuck/run"] if r.meta else None for r in (first, second, named, after_named, later)]
    assert all(r.meta is not None and r.meta["unstuck/session"] == session for r in (second, named, later))
    assert runs[:3] == [run, run, "mine"]
    # ... a named run took the lane, so the next unnamed call started a new run; idle ended it,
    # and until then the door kept it alive: the watchdog never saw it stalled or stuck
    assert "mcp client between calls" in beats
    assert not classes & {"stalled", "stuck"}, classes
    assert len({run, runs[3], runs[4]}) == 3
    info = store.run(session, run)
    assert info is not None
    assert (info.status, info.end_reason) == ("aborted", "superseded")


@pytest.mark.timeout(90)
async def test_stdio_one_client_one_session(door: Door) -> None:
    server = StdioServerParameters(command=UNSTUCK, args=["mcp", "--stdio"], env=door.env)
    async with Client(server, read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
        calls = {key: MISBEHAVING[key] for key in ("echo", "stubborn")}
        answers = await _timed_calls(client, calls)
    echo, stubborn = answers["echo"][1], answers["stubborn"][1]
    assert _text(echo) == "hihi"
    assert _details(stubborn)["reason"] == "timeout_hard"
    assert answers["stubborn"][0] < STUBBORN_HARD_S + ANSWER_SLACK_S
    assert echo.meta is not None
    assert stubborn.meta is not None
    assert echo.meta["unstuck/session"].startswith("mcp:stdio-")
    assert (echo.meta["unstuck/session"], echo.meta["unstuck/run"]) == (
        stubborn.meta["unstuck/session"],
        stubborn.meta["unstuck/run"],
    )


def _post_status(url: str, headers: dict[str, str]) -> int:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.timeout(90)
async def test_with_tokens_only_a_bearer_gets_in(door: Door, processes: Processes) -> None:
    # Given a second door with a token
    url = _start_door({**door.env, "UNSTUCK_API__TOKENS": TOKEN}, processes, "mcp-tokens")
    # When clients come without, with a wrong and with the right token
    refused = [_post_status(url, {}), _post_status(url, {"Authorization": "Bearer nope"})]
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        echo = await client.call_tool("echo", {"text": "in"})
    # Then only the bearer of the token is served
    assert refused == [401, 401]
    assert _text(echo) == "in"


def _node_client(url: str) -> dict[str, Any]:
    if not (TS_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=TS_DIR, check=True, timeout=300)
    done = subprocess.run(
        ["node", "client.mjs", url], cwd=TS_DIR, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def _reason(answer: dict[str, Any]) -> str | None:
    reason: str | None = answer["meta"]["unstuck/details"].get("reason")
    return reason


needs_node = pytest.mark.skipif(
    shutil.which("node") is None or shutil.which("npm") is None,
    reason="the TypeScript SDK test needs node and npm on PATH",
)


@needs_node
@pytest.mark.timeout(300 if not (TS_DIR / "node_modules").is_dir() else 90)
def test_typescript_sdk_over_streamable_http(door: Door) -> None:
    # When the official TypeScript SDK lists the tools, calls the misbehaving ones, watches
    # progress and cancels a call (see mcp_ts/client.mjs)
    out = _node_client(door.url)
    print(f"\nMCP (TypeScript SDK, {out['protocolVersion']}) answered after: ", end="")
    print({key: round(out[key]["elapsed_s"], 2) for key in ("echo", "stubborn", "sleepy", "crash")})
    # Then everything is answered as for the Python SDK, in one unstuck session and run
    assert {"echo", "stubborn", "sleepy", "crash"} <= {tool["name"] for tool in out["tools"]}
    assert (out["echo"]["isError"], out["echo"]["text"]) == (False, "hihi")
    expected = {
        "stubborn": "timeout_hard",
        "sleepy": "timeout_soft",
        "crash": "crashed",
        "unknown": "unknown_tool",
        "malformed": "invalid_arguments",
        "notAnObject": "invalid_arguments",
    }
    assert {key: _reason(out[key]) for key in expected} == expected
    assert all(out[key]["isError"] for key in expected)
    assert STUBBORN_HARD_S <= out["stubborn"]["elapsed_s"] < STUBBORN_HARD_S + ANSWER_SLACK_S
    assert SLEEPY_SOFT_S <= out["sleepy"]["elapsed_s"] < SLEEPY_SOFT_S + ANSWER_SLACK_S
    assert "must be a JSON object" in out["notAnObject"]["text"]
    sessions = {out[key]["meta"]["unstuck/session"] for key in ("echo", "echoAgain", *expected)}
    runs = {out[key]["meta"]["unstuck/run"] for key in ("echo", "echoAgain", *expected)}
    assert sessions == {f"mcp:{out['sessionId']}"}
    assert len(runs) == 1
    assert out["beating"]["text"] == "finished"
    assert [p["progress"] for p in out["beating"]["progress"]][:2] == [1, 2]
    # ... and the call aborted by the client was answered `cancelled` in the ledger
    assert out["cancel"]["cancelled"] is True
    assert out["afterCancel"]["text"] == "still here"
    wait_until(lambda: door.reason("ts-cancel", "r1", "c1") is not None, timeout_s=5, what="cancel answer")
    assert door.reason("ts-cancel", "r1", "c1") == "cancelled"


def test_node_modules_stay_out_of_git() -> None:
    # The trailing slash names a directory: without it, git matches the `node_modules/` pattern
    # only once `npm ci` has made the directory, so the answer depended on which test ran first.
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", f"{TS_DIR / 'node_modules'}/"], cwd=TS_DIR, check=False
    ).returncode
    assert ignored == 0, "add node_modules/ to .gitignore"
    assert (TS_DIR / "package-lock.json").is_file()
    assert os.path.getsize(TS_DIR / "package-lock.json") > 0
