"""Helpers for e2e tests of ``unstuck up`` / ``unstuck demo``: a clean environment, process checks."""

from __future__ import annotations

import os
import subprocess

from tests.harness import REPO


def clean_env() -> dict[str, str]:
    """Our environment without any UNSTUCK_* setting, so up/demo start their own embedded Redis."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNSTUCK_")}
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def pids_matching(pattern: str) -> list[int]:
    """Pids whose full command line contains ``pattern`` (``pgrep -f``), this test's own excluded."""
    out = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True, check=False)
    return [int(pid) for pid in out.stdout.split() if int(pid) != os.getpid()]


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
