"""Stdio upstreams whose pool child died: found and killed by the next pool child.

A pool child that exits stops its upstreams (``stop_sessions`` at ``worker_process_shutdown``),
but one SIGKILLed (a call's hard limit, the OOM killer) cannot. A healthy upstream exits when
its stdin closes; a wedged one never reads it, and some never exit on it. So every started upstream
is noted in a file (owner pid, process group, start time) and each new pool child kills the
groups of owners that are gone. The start time guards against a reused process id.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from pathlib import Path

import psutil

__all__ = ["forget", "note", "reap_orphans"]


def _dir() -> Path:
    return Path(tempfile.gettempdir()) / f"unstuck-upstreams-{os.getuid()}"


def _started(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def note(pgid: int) -> None:
    """Remember the upstream group ``pgid`` started by this process."""
    started = _started(pgid)
    if started is None:
        return
    with contextlib.suppress(OSError):
        _dir().mkdir(mode=0o700, exist_ok=True)
        (_dir() / f"{os.getpid()}-{pgid}").write_text(repr(started))


def forget(pgid: int) -> None:
    """The group ``pgid`` was stopped by its owner: nothing to reap."""
    with contextlib.suppress(OSError):
        (_dir() / f"{os.getpid()}-{pgid}").unlink()


def reap_orphans() -> list[int]:
    """Kill the upstream groups whose owner died; returns the groups killed."""
    killed = []
    with contextlib.suppress(OSError):
        for entry in _dir().iterdir():
            owner, _, group = entry.name.partition("-")
            if not (owner.isdigit() and group.isdigit()) or psutil.pid_exists(int(owner)):
                continue
            pgid = int(group)
            with contextlib.suppress(OSError, ValueError):
                if _started(pgid) == float(entry.read_text()):
                    os.killpg(pgid, signal.SIGKILL)
                    killed.append(pgid)
            with contextlib.suppress(OSError):
                entry.unlink()
    return killed
