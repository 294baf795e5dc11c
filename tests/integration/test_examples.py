"""The framework examples of docs/adapters.md run against a real worker (no network, scripted models)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.harness import REPO, Proc

pytest.importorskip("langgraph")
pytest.importorskip("agents")


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    return {**env, "UNSTUCK_TOOLS__BUILTINS": "exec", "UNSTUCK_TOOL_MODULES": ""}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("example", ["langgraph_agent.py", "openai_agents_agent.py"])
def test_the_example_runs(example: str, env: dict[str, str], worker: Proc) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / example)],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "hello from unstuck" in done.stdout
    assert "Unknown tool: 'no_such_tool'" in done.stdout
