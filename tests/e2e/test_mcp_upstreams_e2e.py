"""MCP servers no one here wrote, behind ``unstuck mcp``, driven by the official Python SDK client.

The upstreams: ``@modelcontextprotocol/server-everything`` and
``@modelcontextprotocol/server-filesystem`` (npm, installed with ``npm ci`` into
``tests/e2e/mcp_upstream_npm``, locked by its package-lock), ``mcp-server-time`` (PyPI, a dev
dependency locked in ``uv.lock``, run from the venv), the misbehaving fixture
``tests/fixtures/mcp_misbehaving.py`` (hangs, wedges, crashes), the same fixture broken so it
cannot start, and a remote server nobody listens for. Every call gets one result by its limit,
and the next call works.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import psutil
import pytest
from mcp import Client

from tests.e2e.conftest import Processes
from tests.e2e.test_mcp_server_e2e import _free_port, _start_door
from tests.harness import REPO, UNSTUCK, Proc, base_env, wait_until
from workers.local.embedded_redis import EmbeddedRedis

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("npm") is None, reason="server-everything needs node and npm on PATH"),
]

NPM_DIR = Path(__file__).parent / "mcp_upstream_npm"
EVERYTHING = NPM_DIR / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
FILESYSTEM = NPM_DIR / "node_modules" / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"
FIXTURE = REPO / "tests" / "fixtures" / "mcp_misbehaving.py"
SOFT_S, HARD_S = 1.0, 3.0  # hang's and wedge's; the fixture's other tools get 15 s / 18 s
FREEZE_HARD_S = 1.5
POOL = 1  # one pool child: every call meets the same upstream process, the one that misbehaved
ANSWER_SLACK_S = 2.0  # the gateway's grace and the answer's way back, on a loaded 2-core machine
CLIENT_TIMEOUT_S = 60.0


@dataclass
class Stack:
    url: str
    env: dict[str, str]
    door: Proc
    worker: Proc
    grow_file: Path
    files: Path


def _upstreams_file(tmp: Path) -> Path:
    fixture = {
        "command": sys.executable,
        "args": [str(FIXTURE)],
        "env": {"MISBEHAVING_GROW_FILE": str(tmp / "grow")},
    }
    limits = {"soft_timeout_s": SOFT_S, "hard_timeout_s": HARD_S}
    # The calls after a crash or a wedge wait for the restart (a Python MCP server takes 1-2 s
    # to start, 3 s on a machine loaded by a parallel `make test`): their soft limit leaves room
    # for it. The call after freeze waits for a new pool child, which reaps the frozen upstream
    # and starts all four at once: 5.8 s in one such run, past the 5 s these calls had then.
    # freeze wedges too, but its hard limit comes before the ping gives up: the pool child is
    # killed, and the next one kills the upstream it left behind.
    tools = {
        "hang": limits,
        "wedge": {**limits, "soft_timeout_s": 0.5},
        "freeze": {"soft_timeout_s": 0.5, "hard_timeout_s": FREEZE_HARD_S},
    }
    servers = {
        "everything": {"command": "node", "args": [str(EVERYTHING), "stdio"]},
        "fs": {"command": "node", "args": [str(FILESYSTEM), str(tmp / "files")]},
        "time": {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]},
        "mis": {
            **fixture,
            "unstuck": {"soft_timeout_s": 15, "hard_timeout_s": 18, "memory_limit_mb": 300, "tools": tools},
        },
        "broken": {**fixture, "env": {"MISBEHAVING_BROKEN": "1"}},  # (and no grow file)
        "down": {"url": f"http://127.0.0.1:{_free_port()}/mcp", "type": "http"},
    }
    path = tmp / "upstreams.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A worker (one pool child), the watchdog and the door, the upstreams from one file."""
    if not (EVERYTHING.is_file() and FILESYSTEM.is_file()):
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NPM_DIR, check=True, timeout=300)
    server = EmbeddedRedis().start()
    tmp = tmp_path_factory.mktemp("upstreams")
    (tmp / "tmp").mkdir()
    (tmp / "files").mkdir()
    (tmp / "files" / "hello.txt").write_text("hello from the filesystem server\n")
    env = base_env(
        server.url,
        UNSTUCK_TOOL_MODULES="",
        UNSTUCK_WATCHDOG__INTERVAL_S="1",
        UNSTUCK_MCP__UPSTREAMS_FILE=str(_upstreams_file(tmp)),
        # The upstreams' notes (workers.tools.upstream_reaper) live under the temp dir, shared by
        # every worker of the user: any new pool child on the machine reaps a dead child's
        # upstream. A private one keeps this stack's orphans for its own next child to reap.
        TMPDIR=str(tmp / "tmp"),
    )
    processes = Processes()
    try:
        watchdog = processes.track(Proc([UNSTUCK, "watchdog", "-n", "watchdog-up@%h"], env, "watchdog-up"))
        url = _start_door(env, processes, "mcp-up")
        worker = processes.worker(env, name="mcp-up", concurrency=POOL)
        watchdog.wait_for_log(" ready.", timeout_s=60)
        # Each pool child starts its own session to each upstream when it starts
        wait_until(lambda: worker.log().count("MCP upstream mis started") >= POOL, timeout_s=60)
        yield Stack(url, env, processes.procs[1], worker, tmp / "grow", (tmp / "files").resolve())
        worker.stop()  # a warm shutdown stops its upstreams; a SIGKILLed worker leaves them running
    finally:
        processes.close()
        server.close()


def _started_pids(worker: Proc, upstream: str) -> list[int]:
    return [int(pid) for pid in re.findall(rf"MCP upstream {upstream} started \(pid (\d+)\)", worker.log())]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _text(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


def _reason(result: types.CallToolResult) -> str | None:
    assert result.meta is not None
    reason: str | None = result.meta["unstuck/details"].get("reason")
    return reason


async def _timed(client: Client, tool: str, arguments: dict[str, Any]) -> tuple[float, types.CallToolResult]:
    started = time.monotonic()
    result = await client.call_tool(tool, arguments)
    return time.monotonic() - started, result


@pytest.mark.timeout(180)
async def test_upstream_tools_served_and_every_failure_answered(stack: Stack) -> None:
    async with Client(stack.url, read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        # The healthy upstream's tools, as the upstream describes them
        echo = await client.call_tool("everything__echo", {"message": "hi"})
        total = await client.call_tool("everything__get-sum", {"a": 2, "b": 3})
        long = await client.call_tool(
            "everything__trigger-long-running-operation", {"duration": 1, "steps": 2}
        )
        # A tool the upstream serves only as a task, called by a client that does not ask for one
        research = await client.call_tool("everything__simulate-research-query", {"topic": "unstuck"})
        refused = await client.call_tool("everything__get-sum", {"a": "two"})
        failed = await client.call_tool("mis__fail", {})
        hung = await _timed(client, "mis__hang", {})
        after_hang = await client.call_tool("mis__echo", {"text": "after hang"})
        crashed = await _timed(client, "mis__crash", {})
        after_crash = await client.call_tool("mis__echo", {"text": "after crash"})
        wedged = await _timed(client, "mis__wedge", {})
        after_wedge = await client.call_tool("mis__echo", {"text": "after wedge"})
        frozen_pid = _started_pids(stack.worker, "mis")[-1]  # the one pool child's session
        frozen = await _timed(client, "mis__freeze", {})
        after_freeze = await client.call_tool("mis__echo", {"text": "after freeze"})
        greedy = await client.call_tool("mis__eat", {"mb": 1000})
        after_greedy = await client.call_tool("mis__echo", {"text": "after greedy"})
    assert {"everything__echo", "everything__get-sum", "mis__hang", "mis__wedge"} <= set(tools)
    assert not [name for name in tools if name.startswith(("broken__", "down__"))]
    assert tools["everything__echo"].annotations is not None
    assert tools["everything__echo"].annotations.read_only_hint is True
    assert tools["everything__get-sum"].input_schema["required"] == ["a", "b"]
    assert (_text(echo), echo.is_error) == ("Echo: hi", False)
    assert "5" in _text(total)
    assert "completed" in _text(long)
    assert (research.is_error, "Research Report: unstuck" in _text(research)) == (False, True)
    assert (refused.is_error, _reason(refused)) == (True, "invalid_arguments")
    assert (failed.is_error, _reason(failed)) == (True, "tool_error")
    assert "failed on purpose" in _text(failed) or "Error executing tool fail" in _text(failed)
    # A hung call is answered at its soft limit (the upstream stays healthy) ...
    assert _reason(hung[1]) == "timeout_soft"
    assert hung[0] < SOFT_S + ANSWER_SLACK_S
    # ... an upstream that dies mid-call has the call answered crashed ...
    assert _reason(crashed[1]) == "crashed"
    assert crashed[0] < HARD_S + ANSWER_SLACK_S
    # ... and a wedged one is answered by its hard limit and killed; each time the next call works
    assert _reason(wedged[1]) in {"timeout_soft", "timeout_hard"}
    assert wedged[0] < HARD_S + ANSWER_SLACK_S
    # ... and one still wedged at its hard limit is killed with its pool child's successor
    assert _reason(frozen[1]) == "timeout_hard"
    assert frozen[0] < FREEZE_HARD_S + ANSWER_SLACK_S
    # (by the child's own exit, when billiard's SIGTERM lets it run its shutdown; else its successor)
    wait_until(lambda: not _alive(frozen_pid), timeout_s=10, what=f"frozen upstream {frozen_pid} killed")
    # ... an upstream past its memory limit (300 MB) fails the allocation: a tool error
    assert (greedy.is_error, _reason(greedy)) == (True, "tool_error")
    assert [_text(r) for r in (after_hang, after_crash, after_wedge, after_freeze, after_greedy)] == [
        "after hang",
        "after crash",
        "after wedge",
        "after freeze",
        "after greedy",
    ]
    # The upstreams that could not start are named in the door's log, with command and stderr
    log = stack.door.log()
    assert "MCP upstream broken" in log
    assert "missing API key" in log
    assert "MCP upstream down" in log


@pytest.mark.timeout(120)
async def test_official_filesystem_and_time_servers_served_and_called(stack: Stack) -> None:
    async with Client(stack.url, read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        read = await client.call_tool("fs__read_text_file", {"path": str(stack.files / "hello.txt")})
        outside = await client.call_tool("fs__read_text_file", {"path": "/etc/hostname"})
        now = await client.call_tool("time__get_current_time", {"timezone": "Europe/Paris"})
        bad_zone = await client.call_tool("time__get_current_time", {"timezone": "Mars/Olympus"})
    # Their tools, served under <name>__<tool> with the upstreams' own schemas and annotations
    served = {"fs__read_text_file", "fs__list_directory", "time__get_current_time", "time__convert_time"}
    assert served <= set(tools)
    assert tools["time__get_current_time"].input_schema["required"] == ["timezone"]
    assert tools["fs__read_text_file"].annotations is not None
    assert tools["fs__read_text_file"].annotations.read_only_hint is True
    assert (_text(read), read.is_error) == ("hello from the filesystem server\n", False)
    # The upstreams' own refusals (isError) come through as tool errors
    assert (outside.is_error, _reason(outside)) == (True, "tool_error")
    assert "Access denied" in _text(outside)
    assert now.is_error is False
    assert json.loads(_text(now))["timezone"] == "Europe/Paris"
    assert (bad_zone.is_error, _reason(bad_zone)) == (True, "tool_error")
    assert "Invalid timezone" in _text(bad_zone)


@pytest.mark.timeout(120)
def test_config_check_names_an_upstream_that_cannot_start(stack: Stack) -> None:
    done = subprocess.run(
        [UNSTUCK, "config", "check"], env=stack.env, capture_output=True, text=True, timeout=90, check=False
    )
    out = done.stdout + done.stderr
    assert "mcpServers.broken" in out, out[-3000:]
    assert str(FIXTURE) in out
    assert "missing API key" in out
    assert "mcpServers.down" in out


TS_DIR = Path(__file__).parent / "mcp_ts"


@pytest.mark.timeout(180)
def test_typescript_sdk_task_augmented_call_returns_its_result_through_tasks_result(stack: Stack) -> None:
    if not (TS_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=TS_DIR, check=True, timeout=300)
    arguments = json.dumps({"duration": 1, "steps": 2})
    done = subprocess.run(
        ["node", "tasks.mjs", stack.url, "everything__trigger-long-running-operation", arguments],
        cwd=TS_DIR,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    # The door offers tasks, and marks every tool optional (never required)
    assert out["capabilities"]["tasks"]["requests"]["tools"]["call"] == {}
    assert out["execution"] == {"taskSupport": "optional"}
    kinds = [message["type"] for message in out["messages"]]
    assert kinds[0] == "taskCreated"
    assert kinds[-1] == "result", out["messages"]
    task_id = out["messages"][0]["taskId"]
    result = out["messages"][-1]["result"]
    # The result came through tasks/result: the upstream's answer, under the call id = task id
    assert "Long running operation completed" in result["content"][0]["text"]
    assert result["_meta"]["unstuck/call"] == task_id
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
    assert out["task"]["status"] == "completed"


@pytest.mark.timeout(120)
async def test_an_upstreams_new_tool_is_followed_and_its_clients_told(stack: Stack) -> None:
    told = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            told.set()

    # A 2025-11-25 session: the 2026-07-28 protocol sends list changes only on subscriptions/listen
    async with Client(
        stack.url, mode="legacy", read_timeout_seconds=CLIENT_TIMEOUT_S, message_handler=on_message
    ) as client:
        before = {tool.name for tool in (await client.list_tools()).tools}
        # When the upstream adds a tool and sends notifications/tools/list_changed
        stack.grow_file.touch()
        with anyio.fail_after(20):
            await told.wait()
        after = {tool.name for tool in (await client.list_tools()).tools}
        grown = await client.call_tool("mis__grown", {})
    # Then the door told its client, lists the new tool, and a worker runs it
    assert "mis__grown" not in before
    assert "mis__grown" in after
    assert (_text(grown), grown.is_error) == ("grown", False)
