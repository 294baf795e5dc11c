"""The README's "write a tool, call it" example runs as written, against a real worker."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import REPO, Proc, WorkerOn

README = REPO / "README.md"


def _block(text: str, lang: str, first_line: str) -> str:
    """The body of the ``lang`` block whose first line starts with ``first_line``."""
    for body in re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE):
        if body.startswith(first_line):
            return str(body)
    raise AssertionError(f"README.md has no {lang} block starting with {first_line!r}")


def _expected_output(text: str) -> str:
    after_agent = text[text.index("# agent.py") :]
    return _block(after_agent, "text", "c1 ")


@pytest.mark.timeout(120)
def test_the_readme_tool_and_agent_run_and_print_what_the_readme_says(
    env: dict[str, str], worker_on: WorkerOn, tmp_path: Path
) -> None:
    # Given the README's tool module and agent script, written out as the README names them
    text = README.read_text(encoding="utf-8")
    (tmp_path / "mytools.py").write_text(_block(text, "python", "# mytools.py"), encoding="utf-8")
    (tmp_path / "agent.py").write_text(_block(text, "python", "# agent.py"), encoding="utf-8")
    env = {**env, "UNSTUCK_TOOL_MODULES": "mytools", "PYTHONPATH": f"{tmp_path}:{REPO}"}
    # And a worker that imports that module
    worker: Proc = worker_on(env)
    # When the agent script runs
    done = subprocess.run(
        [sys.executable, str(tmp_path / "agent.py")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    # Then it prints exactly the README's output block
    assert done.returncode == 0, done.stderr
    assert done.stdout == _expected_output(text), worker.log()[-3000:]
