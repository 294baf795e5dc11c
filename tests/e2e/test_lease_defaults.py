"""With the default lease, a dead worker host is answered within 5 s and a busy one never is.

The worker runs with the shipped lease settings (no UNSTUCK_LEASE__* override). A host death
is the worker's main process SIGKILLed; a saturated host is every core spinning; a GC-like
stall is the main process SIGSTOPped for 2 s, then SIGCONTed. Each figure is printed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import Processes
from tests.harness import base_env, kill_pids, settings_in_env, wait_until
from workers import ToolCall, ToolGateway, ToolResult
from workers.local.embedded_redis import EmbeddedRedis
from workers.settings import Settings

# Serial: one test keeps every core busy, which would slow every test beside it, and the
# others measure a worker_lost bound of the shipped lease.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

HOST_DEATH_BOUND_S = 5.0
STALL_S = 2.0


@pytest.fixture
def default_lease_env(private_redis: EmbeddedRedis) -> dict[str, str]:
    env = base_env(private_redis.url)
    for key in ("UNSTUCK_LEASE__TTL_S", "UNSTUCK_LEASE__RENEW_INTERVAL_S"):
        env.pop(key)
    return env


@pytest.fixture
def gateway(default_lease_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[ToolGateway]:
    settings: Settings = settings_in_env(default_lease_env, monkeypatch)
    assert settings.lease.ttl_s == Settings().lease.ttl_s  # the shipped default
    gw = ToolGateway(settings)
    yield gw
    gw.close()


def _running(gateway: ToolGateway, run: str, call_id: str) -> bool:
    ledger = gateway._rt.ledger
    record = ledger.record(ledger.keys("s1", run), call_id)
    return record is not None and record.state.value == "running"


def _slow_call_in_thread(
    gateway: ToolGateway, run: str, seconds: float
) -> tuple[threading.Thread, list[ToolResult], list[float]]:
    results: list[ToolResult] = []
    returned: list[float] = []
    call = ToolCall(id=f"{run}-c", name="slow", arguments={"seconds": seconds})

    def go() -> None:
        results.extend(gateway.call_tools(session_key="s1", run_id=run, calls=[call]))
        returned.append(time.monotonic())

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    wait_until(lambda: _running(gateway, run, call.id), timeout_s=15, what="the call running")
    return thread, results, returned


@pytest.mark.timeout(90)
def test_a_dead_worker_host_is_answered_worker_lost_within_five_seconds(
    processes: Processes, default_lease_env: dict[str, str], gateway: ToolGateway
) -> None:
    worker = processes.worker(default_lease_env, name="w1")
    thread, results, returned = _slow_call_in_thread(gateway, "kill", 30)
    orphans = worker.children()
    processes.strays.extend(orphans)
    killed = time.monotonic()
    worker.kill_hard()
    thread.join(HOST_DEATH_BOUND_S + 10)
    after_s = returned[0] - killed
    print(f"worker_lost {after_s:.2f}s after the kill (lease TTL {gateway._rt.settings.lease.ttl_s}s)")
    assert [r.reason for r in results] == ["worker_lost"]
    assert after_s <= HOST_DEATH_BOUND_S
    kill_pids(orphans)


def _spinners() -> list[subprocess.Popen[bytes]]:
    spin = "while True:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 2)]


@pytest.mark.timeout(90)
def test_no_false_worker_lost_with_every_core_busy(
    processes: Processes, default_lease_env: dict[str, str], gateway: ToolGateway
) -> None:
    processes.worker(default_lease_env, name="w1")
    spinners = _spinners()
    try:
        thread, results, _ = _slow_call_in_thread(gateway, "busy", 12)
        thread.join(40)
    finally:
        kill_pids([s.pid for s in spinners])
        for spinner in spinners:
            spinner.wait()
    print(f"with {len(spinners)} spinning processes: {[r.reason or 'ok' for r in results]}")
    assert [(r.is_error, r.reason) for r in results] == [(False, None)]


@pytest.mark.timeout(90)
def test_no_false_worker_lost_through_a_two_second_stall_of_the_main_process(
    processes: Processes, default_lease_env: dict[str, str], gateway: ToolGateway
) -> None:
    worker = processes.worker(default_lease_env, name="w1")
    thread, results, _ = _slow_call_in_thread(gateway, "stall", 8)
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        time.sleep(STALL_S)  # the stall itself is the fault injected, not a wait for a condition
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    thread.join(40)
    print(f"after a {STALL_S}s SIGSTOP of the main process: {[r.reason or 'ok' for r in results]}")
    assert [(r.is_error, r.reason) for r in results] == [(False, None)]
