"""An agent loop in another language (Node 20, fetch only) drives ``unstuck serve`` in every format.

Each format's turn sends a healthy call, a hung one, a crashing one, an unknown tool and
malformed arguments as the provider itself would, and checks what comes back to append.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import UNSTUCK, Proc, base_env, start_beat, start_watchdog, start_worker
from workers.local.embedded_redis import EmbeddedRedis, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SCRIPT = Path(__file__).parent / "node" / "agent_loop.mjs"
TOKEN = "node-token"
NODE = shutil.which("node")


@pytest.fixture
def served() -> Iterator[str]:
    server = EmbeddedRedis().start()
    env = {**base_env(server.url), "UNSTUCK_API__TOKENS": TOKEN}
    port = free_port()
    procs: list[Proc] = []
    try:
        # A pool slot for each of the 15 calls that reach a worker (5 formats x echo, stubborn,
        # crash), so none queues. With 6 slots the 5 crashes each killed the one free child and
        # waited for its replacement (about a second apiece on a loaded machine), so a hung call
        # queued behind them started over 3 s late and its deadline (hard limit + 3 s queue
        # allowance) answered `deadline_exceeded` before its hard limit did (CI stop 50, gemini).
        procs += [start_worker(env, concurrency=15, name="node"), start_watchdog(env), start_beat(env)]
        serve = Proc([UNSTUCK, "serve", "--port", str(port)], env, "serve")
        procs.append(serve)
        serve.wait_for_log("Uvicorn running on", timeout_s=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        for proc in procs:
            proc.kill()
        server.close()


@pytest.mark.serial  # a hung tool's hard kill must start within the 3 s queue allowance of its deadline
@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_a_node_agent_loop_gets_every_answer_in_every_format(served: str) -> None:
    # When the Node agent loop runs one turn per format, all at once
    assert NODE is not None
    done = subprocess.run([NODE, str(SCRIPT), served, TOKEN], capture_output=True, text=True, timeout=150)
    # Then each turn got one result per call, the expected reasons, and a well-formed append
    assert done.returncode == 0, f"stdout: {done.stdout}\nstderr: {done.stderr}"
    report = json.loads(done.stdout)
    print(json.dumps(report["turns"]))  # the figures, with -s
    assert {turn["format"] for turn in report["turns"]} == {
        "neutral", "anthropic", "openai-chat", "openai-responses", "gemini"
    }  # fmt: skip
    for turn in report["turns"]:
        # The hung call is answered at its hard limit (2 s) plus the worker's reaction, not later
        assert turn["seconds"] < 10, turn
