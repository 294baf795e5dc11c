"""What ``unstuck mcp`` in front of an MCP server costs (``python -m bench.mcp_upstreams``).

One private redis-server, one ``unstuck worker`` (one pool child) and ``unstuck mcp`` with two
upstreams from an ``mcp.upstreams_file``: ``@modelcontextprotocol/server-everything`` (npm,
installed into ``tests/e2e/mcp_upstream_npm`` by ``npm ci``) and the misbehaving fixture.

* latency: the official Python SDK client calls server-everything's ``echo`` sequentially,
  first directly (stdio, the client starts the server) and then through the door as
  ``everything__echo`` (Streamable HTTP); p50 and p99 of each and the p50 difference, against
  the target of at most +3 ms. A local ``@tool`` echo through the same door shows how much of
  the difference is the door and worker path every call takes, upstream or not;
* failures: how long the fixture's hung, crashing and wedging calls take to be answered, and
  with what, each followed by a healthy call.

Nothing is asserted; the target is printed PASS or MISS.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.harness import REPO, UNSTUCK, Proc, base_env, start_worker, wait_until
from workers.local.embedded_redis import EmbeddedRedis, free_port

NPM_DIR = REPO / "tests" / "e2e" / "mcp_upstream_npm"
EVERYTHING = NPM_DIR / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
FIXTURE = REPO / "tests" / "fixtures" / "mcp_misbehaving.py"
TARGET_MS = 3.0
SCENARIOS = (("hung", "mis__hang"), ("crashes mid-call", "mis__crash"), ("wedged", "mis__wedge"))


def _percentiles(samples_ms: list[float]) -> tuple[float, float]:
    ordered = sorted(samples_ms)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def _echoes(client: Client, tool: str, key: str, calls: int) -> list[float]:
    for _ in range(20):  # warm up: connections, the pool child's session
        await client.call_tool(tool, {key: "warm"})
    samples = []
    for n in range(calls):
        started = time.perf_counter()
        result = await client.call_tool(tool, {key: f"m{n}"})
        samples.append((time.perf_counter() - started) * 1000)
        assert not result.is_error, result
    return samples


async def _direct(calls: int) -> list[float]:
    server = StdioServerParameters(command="node", args=[str(EVERYTHING), "stdio"])
    async with Client(server, read_timeout_seconds=60) as client:
        return await _echoes(client, "echo", "message", calls)


async def _proxied(url: str, calls: int) -> tuple[list[float], list[float]]:
    """The upstream's echo through the door, then a local ``@tool`` echo (the door's own cost)."""
    async with Client(url, read_timeout_seconds=60) as client:
        upstream = await _echoes(client, "everything__echo", "message", calls)
        local = await _echoes(client, "echo", "text", calls)
    return upstream, local


def _reason(result: types.CallToolResult) -> str:
    details = (result.meta or {}).get("unstuck/details", {})
    return str(details.get("reason") or ("error" if result.is_error else "ok"))


async def _scenarios(url: str) -> list[tuple[str, float, str, str]]:
    rows = []
    async with Client(url, read_timeout_seconds=60) as client:
        for label, tool in SCENARIOS:
            started = time.perf_counter()
            result = await client.call_tool(tool, {})
            took = time.perf_counter() - started
            after = await client.call_tool("mis__echo", {"text": "next"})
            rows.append((label, took, _reason(result), _reason(after)))
    return rows


def _upstreams(path: Path) -> None:
    limits = {"soft_timeout_s": 1, "hard_timeout_s": 3}
    tools = {"hang": limits, "wedge": {**limits, "soft_timeout_s": 0.5}}
    servers: dict[str, Any] = {
        "everything": {"command": "node", "args": [str(EVERYTHING), "stdio"]},
        "mis": {
            "command": sys.executable,
            "args": [str(FIXTURE)],
            "unstuck": {"soft_timeout_s": 5, "hard_timeout_s": 8, "tools": tools},
        },
    }
    path.write_text(json.dumps({"mcpServers": servers}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    calls = parser.parse_args(argv).calls
    if not EVERYTHING.is_file():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NPM_DIR, check=True, timeout=300)
    redis = EmbeddedRedis().start()
    with tempfile.TemporaryDirectory() as tmp:
        upstreams = Path(tmp) / "upstreams.json"
        _upstreams(upstreams)
        env = base_env(redis.url, UNSTUCK_MCP__UPSTREAMS_FILE=str(upstreams))  # + tests.misbehaving_tools
        port = free_port()
        worker = start_worker(env, concurrency=1, name="bench-mcp-up")
        door = Proc([UNSTUCK, "mcp", "--port", str(port)], env, "bench-mcp-door")
        try:
            door.wait_for_log("Streamable HTTP on", timeout_s=60)
            wait_until(lambda: "MCP upstream everything started" in worker.log(), timeout_s=60)
            url = f"http://127.0.0.1:{port}/mcp"
            direct = anyio.run(_direct, calls)
            proxied, local = anyio.run(_proxied, url, calls)
            rows = anyio.run(_scenarios, url)
        finally:
            door.kill()
            worker.kill()
            redis.close()
    (d50, d99), (p50, p99), (l50, l99) = _percentiles(direct), _percentiles(proxied), _percentiles(local)
    added = p50 - d50
    print(f"server-everything echo, {calls} sequential calls, official Python SDK client")
    print(f"  direct (stdio):              p50 {d50:6.2f} ms  p99 {d99:6.2f} ms")
    print(f"  through unstuck mcp (HTTP):  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms")
    print(f"  a local @tool echo, same door: p50 {l50:6.2f} ms  p99 {l99:6.2f} ms (the door and worker path)")
    verdict = "PASS" if added <= TARGET_MS else "MISS"
    print(f"  added p50: {added:+.2f} ms (target <= +{TARGET_MS:.0f} ms): {verdict}")
    print("misbehaving fixture (soft 1 s, hard 3 s; wedge soft 0.5 s), each followed by mis__echo")
    for label, took, reason, after in rows:
        print(f"  {label:<17} answered in {took:5.2f} s: {reason:<13} next call: {after}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
