"""What ``bench.overhead`` measures besides wall time: CPU of every process, Redis commands, traces.

Also the two fault figures (a hung tool, a killed worker) and the freezing of the worker
that is not being measured.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import psutil
import redis

from tests.harness import Proc, kill_pids, wait_until
from workers import ToolCall, ToolGateway
from workers.settings import Settings

__all__ = [
    "HUNG_SOFT_S",
    "CommandStats",
    "CpuMeter",
    "freeze",
    "hung_tool_overshoot_ms",
    "percentile",
    "thaw",
    "timed_calls",
    "trace_one_call",
    "warm_up",
    "worker_kill_s",
]

HUNG_SOFT_S = 1.0  # the soft limit of tests.misbehaving_tools.sleepy


def percentile(samples: list[float], q: float) -> float:
    """The ``q`` quantile of ``samples`` (nearest rank)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def warm_up(client: Callable[[int], None]) -> None:
    """20 untimed calls: connections, pool children and imports warm before the clock starts."""
    for n in range(20):
        client(100_000 + n)


def timed_calls(client: Callable[[int], None], calls: int) -> list[float]:
    """Seconds each of ``calls`` sequential calls took."""
    samples = []
    for n in range(calls):
        start = time.perf_counter()
        client(n)
        samples.append(time.perf_counter() - start)
    return samples


def freeze(worker: Proc) -> None:
    """SIGSTOP a worker's whole process group (main process and pool children)."""
    os.killpg(worker.pid, signal.SIGSTOP)


def thaw(worker: Proc) -> None:
    """SIGCONT a worker frozen by :func:`freeze` (nothing to do once it is gone)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGCONT)


class CpuMeter:
    """CPU seconds (user + system) of a set of processes: this client, a worker tree, redis-server, a door."""

    def __init__(self, worker_pid: int, redis_pid: int, door_pid: int | None = None) -> None:
        self._worker_pid = worker_pid
        self._redis_pid = redis_pid
        self._door_pid = door_pid  # `unstuck serve` or `unstuck mcp`, when the calls go through one

    def _processes(self) -> Iterable[tuple[str, psutil.Process]]:
        worker = psutil.Process(self._worker_pid)
        children = [("pool children", child) for child in worker.children(recursive=True)]
        return [
            ("client", psutil.Process()),
            ("worker main", worker),
            *children,
            ("redis-server", psutil.Process(self._redis_pid)),
            *([("door", psutil.Process(self._door_pid))] if self._door_pid else []),
        ]

    def sample(self) -> dict[tuple[str, int], float]:
        """CPU seconds so far, by (role, pid) (pool children included)."""
        seconds = {}
        for role, process in self._processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                times = process.cpu_times()
                seconds[(role, process.pid)] = times.user + times.system
        return seconds

    @staticmethod
    def spent(before: dict[tuple[str, int], float], after: dict[tuple[str, int], float]) -> dict[str, float]:
        """CPU seconds between two samples, by role; a pool child born in between counts from zero."""
        by_role: dict[str, float] = {}
        for (role, pid), seconds in after.items():
            by_role[role] = by_role.get(role, 0.0) + seconds - before.get((role, pid), 0.0)
        return by_role


class CommandStats:
    """Redis commands executed between two snapshots (``INFO commandstats``), by command."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def snapshot(self) -> dict[str, int]:
        """Calls so far, by command name."""
        info = self._client.info("commandstats")
        return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}

    @staticmethod
    def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
        """Commands run in between, less the one ``INFO`` of the second snapshot."""
        counts = {k: n - before.get(k, 0) for k, n in after.items() if n - before.get(k, 0) > 0}
        if counts.get("info"):
            counts["info"] -= 1
        return {k: n for k, n in counts.items() if n}


def trace_one_call(url: str, label: str, operation: Callable[[], None]) -> None:
    """Print each Redis command (not those run inside scripts) of one call, with its time and client."""
    seen: list[dict[str, Any]] = []
    listening = threading.Event()
    client = redis.Redis.from_url(url, decode_responses=True)

    def listen() -> None:
        with contextlib.suppress(redis.RedisError), client.monitor() as monitor:  # type: ignore[no-untyped-call]
            listening.set()
            for command in monitor.listen():
                seen.append(command)

    threading.Thread(target=listen, daemon=True).start()
    listening.wait(5)
    begin = time.time()
    operation()
    end = time.time()
    client.ping()  # a command after the call, so we know the monitor has seen all of it
    wait_until(lambda: any(c["time"] >= end for c in seen), timeout_s=5, what="monitor caught up")
    mine = [c for c in seen if begin <= c["time"] <= end and c["client_type"] != "lua"]
    print(f"\n{label}: {len(mine)} commands from clients")
    for command in mine:
        who = f"{command['client_address']}:{command['client_port']}"
        print(f"  {(command['time'] - begin) * 1000:7.2f} ms  {who:<17} {command['command'][:100]}")


def hung_tool_overshoot_ms(settings: Settings, runs: int = 5) -> list[float]:
    """How long after the soft limit a hung tool's ``timeout_soft`` arrives (submit to result)."""
    gateway = ToolGateway(settings)
    overshoot = []
    for n in range(runs):
        start = time.perf_counter()
        call = ToolCall(id=f"hang{n}", name="sleepy", arguments={"seconds": 30})
        (result,) = gateway.call_tools(session_key="bench-hung", run_id="r", calls=[call])
        assert result.reason == "timeout_soft", result
        overshoot.append((time.perf_counter() - start - HUNG_SOFT_S) * 1000)
    gateway.close()
    return overshoot


def worker_kill_s(settings: Settings, worker: Proc) -> float:
    """Kill the worker's main process mid-call; seconds from the kill to ``worker_lost``."""
    gateway = ToolGateway(settings)
    ledger = gateway._rt.ledger
    keys = ledger.keys("bench-kill", "r")
    box: list[tuple[float, str | None]] = []

    def call() -> None:
        (result,) = gateway.call_tools(
            session_key="bench-kill",
            run_id="r",
            calls=[ToolCall(id="k", name="slow", arguments={"seconds": 60})],
        )
        box.append((time.perf_counter(), result.reason))

    thread = threading.Thread(target=call)
    thread.start()
    wait_until(
        lambda: (r := ledger.record(keys, "k")) is not None and r.state.value == "running", timeout_s=15
    )
    orphans = worker.children()
    killed = time.perf_counter()
    worker.kill_hard()
    kill_pids(orphans)
    thread.join()
    gateway.close()
    answered, reason = box[0]
    assert reason == "worker_lost", reason
    return answered - killed
