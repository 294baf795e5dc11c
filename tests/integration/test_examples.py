"""The README's runnable framework examples run, against a real worker (no network, scripted models)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.harness import REPO, Proc, base_env, start_worker

pytest.importorskip("langgraph")
pytest.importorskip("agents")


@pytest.fixture
def exec_env(redis_url: str) -> dict[str, str]:
    return base_env(redis_url, UNSTUCK_TOOLS__BUILTINS="exec", UNSTUCK_TOOL_MODULES="")


@pytest.fixture
def exec_worker(exec_env: dict[str, str]) -> Iterator[Proc]:
    proc = start_worker(exec_env, name="w-examples")
    yield proc
    proc.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("example", ["langgraph_agent.py", "openai_agents_agent.py"])
def test_the_example_runs(example: str, exec_env: dict[str, str], exec_worker: Proc) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / example)],
        env=exec_env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "hello from unstuck" in done.stdout
    assert "Unknown tool: 'no_such_tool'" in done.stdout
