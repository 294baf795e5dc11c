"""A worker that stops leaves none of its MCP upstreams running.

The upstream here outlives its closed stdin, as ``@modelcontextprotocol/server-everything``
does: a pool child that only let its pipes close at exit left one such process behind per child
and per stop (found as an orphaned server-everything after ``make test-openclaw``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import Processes
from tests.harness import REPO, base_env, wait_until
from workers.local.embedded_redis import EmbeddedRedis

pytestmark = pytest.mark.slow

FIXTURE = REPO / "tests" / "fixtures" / "mcp_misbehaving.py"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_warm_shutdown_stops_the_upstreams_its_pool_children_started(
    private_redis: EmbeddedRedis, processes: Processes, tmp_path: Path
) -> None:
    upstream = {"command": sys.executable, "args": [str(FIXTURE)], "env": {"MISBEHAVING_OUTLIVE_STDIN": "1"}}
    upstreams = tmp_path / "upstreams.json"
    upstreams.write_text(json.dumps({"mcpServers": {"stays": upstream}}))
    (tmp_path / "tmp").mkdir()
    env = base_env(
        private_redis.url,
        UNSTUCK_TOOL_MODULES="",
        UNSTUCK_MCP__UPSTREAMS_FILE=str(upstreams),
        TMPDIR=str(tmp_path / "tmp"),  # the reaper's notes: no other worker reaps these
    )
    worker = processes.worker(env, name="upstream-stop", concurrency=2)
    # One per pool child (the main process's lister, closed before the fork, logs before the
    # worker's logging is set up).
    wait_until(lambda: worker.log().count("MCP upstream stays started") >= 2, timeout_s=60)
    pids = [int(p) for p in re.findall(r"MCP upstream stays started \(pid (\d+)\)", worker.log())]
    running = [pid for pid in pids if _alive(pid)]
    assert len(running) == 2, f"each pool child's upstream runs: {pids}, alive {running}"
    try:
        worker.stop()
        wait_until(
            lambda: not any(_alive(pid) for pid in running), timeout_s=10, what="the upstreams to be gone"
        )
    finally:
        for pid in running:
            if _alive(pid):
                psutil.Process(pid).kill()
