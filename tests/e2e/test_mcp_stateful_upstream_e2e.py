"""An MCP upstream that keeps state in memory looks like one server to every client.

The upstream is the misbehaving fixture's ``count``: a counter in the upstream process's
memory. Marked ``"stateful": true``, its calls go to its own queue, which one worker with one
pool child serves (``unstuck worker --upstream mem``), beside an ordinary worker with two pool
children; the same fixture unmarked (``plain``) is the control: there each pool child has its
own upstream process, with its own counter.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import anyio
import mcp_types as types
import pytest
from mcp import Client

from tests.e2e.conftest import Processes
from tests.e2e.test_mcp_server_e2e import _start_door
from tests.harness import REPO, UNSTUCK, Proc, base_env, wait_until
from workers.local.embedded_redis import EmbeddedRedis

pytestmark = pytest.mark.slow

FIXTURE = REPO / "tests" / "fixtures" / "mcp_misbehaving.py"
POOL = 2  # the ordinary worker's pool children: two upstream processes of plain, two counters
BUSY_S = 0.5  # each count call holds its pool child this long, so calls at once take both
CLIENT_TIMEOUT_S = 60.0


@dataclass
class Stack:
    url: str
    worker: Proc
    mem_worker: Proc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The door, an ordinary worker (two pool children) and the stateful upstream's own worker."""
    server = EmbeddedRedis().start()
    tmp = tmp_path_factory.mktemp("stateful")
    (tmp / "tmp").mkdir()
    fixture = {"command": sys.executable, "args": [str(FIXTURE)]}
    servers = {"mem": {**fixture, "unstuck": {"stateful": True}}, "plain": fixture}
    (tmp / "upstreams.json").write_text(json.dumps({"mcpServers": servers}))
    env = base_env(
        server.url,
        UNSTUCK_TOOL_MODULES="",
        UNSTUCK_MCP__UPSTREAMS_FILE=str(tmp / "upstreams.json"),
        TMPDIR=str(tmp / "tmp"),  # the upstreams' reaper notes: this stack's own
    )
    processes = Processes()
    try:
        url = _start_door(env, processes, "mcp-stateful")
        worker = processes.worker(env, name="stateless", concurrency=POOL)
        mem_worker = processes.track(
            Proc([UNSTUCK, "worker", "--upstream", "mem", "-n", "mem@%h", "-l", "INFO"], env, "worker-mem")
        )
        mem_worker.wait_for_log(" ready.", timeout_s=60)
        wait_until(lambda: worker.log().count("MCP upstream plain started") >= POOL, timeout_s=60)
        wait_until(lambda: "MCP upstream mem started" in mem_worker.log(), timeout_s=60)
        yield Stack(url, worker, mem_worker)
    finally:
        processes.close()
        server.close()


def _count(result: types.CallToolResult) -> tuple[int, str]:
    assert not result.is_error, result
    text = "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))
    seen, pid = text.split(" pid=")
    return int(seen), pid


async def _at_once(clients: list[Client], tool: str) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []

    async def one(client: Client) -> None:
        found.append(_count(await client.call_tool(tool, {"seconds": BUSY_S})))

    async with anyio.create_task_group() as tasks:
        for client in clients:
            tasks.start_soon(one, client)
    return found


@pytest.mark.timeout(180)
async def test_a_stateful_upstreams_calls_all_meet_one_process(stack: Stack) -> None:
    async with (
        Client(stack.url, read_timeout_seconds=CLIENT_TIMEOUT_S) as first,
        Client(stack.url, read_timeout_seconds=CLIENT_TIMEOUT_S) as second,
    ):
        # The control: two calls at once to the unmarked upstream take both pool children,
        # each with its own upstream process and its own counter
        plain = await _at_once([first, second], "plain__count")
        # One client's calls, one after the other, then both clients' at once
        sequence = [_count(await first.call_tool("mem__count", {})) for _ in range(3)]
        together = await _at_once([first, second, first, second], "mem__count")
    assert len({pid for _, pid in plain}) == 2, plain
    # Every call of the stateful upstream met the same process, whose counter went on
    assert [seen for seen, _ in sequence] == [1, 2, 3]
    assert sorted(seen for seen, _ in together) == [4, 5, 6, 7]
    assert len({pid for _, pid in [*sequence, *together]}) == 1
    # It runs in its own worker only: the ordinary worker never started it
    assert "MCP upstream mem started" not in stack.worker.log()
    assert "MCP upstream plain started" not in stack.mem_worker.log()
