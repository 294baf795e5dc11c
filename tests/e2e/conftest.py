"""Helpers for e2e tests of ``unstuck up`` / ``unstuck demo``: a clean environment, process checks."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import psutil
import pytest

from tests.harness import (
    REPO,
    Proc,
    base_env,
    kill_pids,
    settings_in_env,
    start_beat,
    start_watchdog,
    start_worker,
)
from workers.local.embedded_redis import EmbeddedRedis
from workers.settings import Settings


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
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


# -- backbone e2e: a private redis-server per test, real worker/beat subprocesses -------------


@pytest.fixture
def private_redis() -> Iterator[EmbeddedRedis]:
    """A redis-server of this test's own (never the shared 127.0.0.1:6379), AOF off."""
    server = EmbeddedRedis().start()
    yield server
    server.close()


@pytest.fixture
def backbone_env(private_redis: EmbeddedRedis) -> dict[str, str]:
    """Environment of worker/beat subprocesses: the private Redis, test tools, 3 s leases."""
    return base_env(private_redis.url, UNSTUCK_WATCHDOG__INTERVAL_S="1")


@pytest.fixture
def backbone_settings(backbone_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings of this test process matching ``backbone_env``."""
    return settings_in_env(backbone_env, monkeypatch)


class Processes:
    """Workers, beats and stray pids a test started; all are killed at teardown."""

    def __init__(self) -> None:
        self.procs: list[Proc] = []
        self.strays: list[int] = []

    def worker(self, env: dict[str, str], *, name: str, concurrency: int = 2) -> Proc:
        proc = start_worker(env, concurrency=concurrency, name=name)
        self.procs.append(proc)
        self.strays.extend(proc.children())
        return proc

    def beat(self, env: dict[str, str]) -> Proc:
        proc = start_beat(env)
        self.procs.append(proc)
        return proc

    def watchdog(self, env: dict[str, str], *, name: str = "wd") -> Proc:
        proc = start_watchdog(env, name=name)
        self.procs.append(proc)
        return proc

    def track(self, proc: Proc) -> Proc:
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            self.strays.extend(proc.children())
        for proc in self.procs:
            proc.kill()
        kill_pids(self.strays)


@pytest.fixture
def processes() -> Iterator[Processes]:
    """Start processes through this; every one of them (and their pool children) dies at teardown."""
    started = Processes()
    yield started
    started.close()
