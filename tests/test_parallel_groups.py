"""The parallel run keeps each module-scoped fixture on one worker (tests/conftest.py's groups).

pytest-xdist's ``loadgroup`` works by a side channel that a pytest upgrade can break without an
error; this test runs a two-worker session on a scratch module and counts the fixture's builds.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.harness import REPO

SCRATCH = """
import os
import pytest

@pytest.fixture(scope="module")
def built_once():
    with open(os.environ["BUILDS_FILE"], "a") as builds:
        builds.write("built\\n")

@pytest.mark.parametrize("n", range(8))
def test_shares_the_module_fixture(built_once, n):
    pass
"""


def test_a_module_fixture_is_built_once_across_two_workers(tmp_path: Path) -> None:
    # Given a module whose eight tests share one module-scoped fixture, next to our conftest
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    (suite / "test_scratch.py").write_text(SCRATCH)
    builds = tmp_path / "builds"
    # When two xdist workers run it as make test does
    argv = [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup"]
    argv += ["-p", "no:cacheprovider", "-p", "no:langsmith_plugin", "--rootdir", str(suite), str(suite)]
    env = {"BUILDS_FILE": str(builds), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env=env)
    # Then all eight passed and the fixture was built once
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 passed" in done.stdout
    assert builds.read_text().splitlines() == ["built"]
