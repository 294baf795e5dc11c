"""Loop-detection cost: detector CPU per call, and the Redis round trip it adds (``python -m bench.loops``).

Starts its own redis-server on a free loopback port (never the shared one) and stops it at
the end. The window is kept full, with a mix of tools, args and outcomes, so every detector
walks the whole history.

The check a guarded call pays is ``check_call`` (append + the window's signals, kept in Redis
by the loop scripts); targets: at most 2x a PING at historySize 30 and 3x at 300,
printed PASS or MISS. ``record_call`` (append + the whole window) is printed beside it, and
the same check decided in Python from the window with no state kept in Redis
(:mod:`bench.loops_python_window`): the alternative the loop scripts are kept against.
"""

from __future__ import annotations

import shutil
import socket
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from bench.loops_python_window import WindowOnlyHistory
from workers.core.loops import (
    HistoryEntry,
    InMemoryLoopHistory,
    LoopGuard,
    RunScope,
    evaluate,
    resolve_loop_config,
)
from workers.store.loop_history import RedisLoopHistory

SIZES = (30, 300)
CHECK_TARGETS = {30: 2.0, 300: 3.0}  # check cost as a multiple of PING


def _window(size: int) -> list[HistoryEntry]:
    tools = ("read", "exec", "write", "command_status")
    return [
        HistoryEntry(i, tools[i % 4], f"{tools[i % 4]}:{i % 7}", f"c{i}", None, f"h{i % 5}", None, i)
        for i in range(size)
    ]


def detector_cpu_us(size: int, iterations: int = 2000) -> float:
    """Mean CPU microseconds of one ``evaluate`` against a full window of ``size`` records."""
    config = resolve_loop_config({"enabled": True, "historySize": size}, None)
    window = _window(size)
    start = time.process_time()
    for _ in range(iterations):
        evaluate(window, tool="read", args={"path": "/a"}, args_hash="read:3", run_id=None, config=config)
    return (time.process_time() - start) / iterations * 1e6


def guard_cpu_us(size: int, iterations: int = 2000) -> float:
    """Mean CPU microseconds of before_call + after_call (hashing included) on the memory store."""
    guard = LoopGuard(
        InMemoryLoopHistory(), resolve_loop_config({"enabled": True, "historySize": size}, None)
    )
    scope = RunScope("bench", "run")
    result = {"content": [{"type": "text", "text": "ok"}], "details": {"status": "done"}}
    start = time.process_time()
    for n in range(iterations):
        pending = guard.before_call(scope, "read", {"path": f"/f{n % 13}"}, now_ms=n)
        guard.after_call(pending, result, now_ms=n)
    return (time.process_time() - start) / iterations * 1e6


def _median_us(operation: Callable[[], object], iterations: int) -> float:
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        operation()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


@contextmanager
def _redis_server() -> Iterator[redis.Redis]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "Ready to accept connections" in line:
                break
        client = redis.Redis(host="127.0.0.1", port=port)
        yield client
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _fill(store: RedisLoopHistory, scope: RunScope, size: int) -> None:
    """A full window of ``size`` records (and one more), every one answered."""
    tools = ("read", "exec", "write", "command_status")
    for n in range(size + 1):
        tool = tools[n % 4]
        store.record_call(scope, HistoryEntry(0, tool, f"{tool}:{n % 7}", f"c{n}"), size, now_ms=n)
        done = HistoryEntry(0, tool, f"{tool}:{n % 7}", f"c{n}", result_hash=f"h{n % 5}")
        store.record_outcome(scope, done, size, None, now_ms=n)


def redis_round_trips_us(
    client: redis.Redis, size: int, iterations: int = 2000
) -> tuple[float, float, float, float, float]:
    """Median µs of PING, the check, the append + window script and the outcome script (full window).

    The fifth figure is the same check decided in Python from the window
    (:mod:`bench.loops_python_window`).
    """
    store = RedisLoopHistory(client, prefix="bench", ttl_s=60)
    scope = RunScope(f"bench-{size}", "run")
    window_scope = RunScope(f"bench-window-{size}", "run")
    _fill(store, scope, size)
    _fill(store, window_scope, size)
    window_only = WindowOnlyHistory(client, prefix="bench", ttl_s=60)
    entry = HistoryEntry(0, "read", "read:3", "cX")
    done = HistoryEntry(0, "read", "read:3", "cX", result_hash="h")
    # PING and both checks alternate, so that all see the same machine (it may be shared).
    ping_s, check_s, python_s = [], [], []
    for _ in range(iterations):
        start = time.perf_counter()
        client.ping()
        ping_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        _, seq = store.check_call(scope, entry, size, 20, now_ms=1)
        check_s.append(time.perf_counter() - start)
        store.discard_call(scope, seq)  # untimed: the window stays as it was for the next check
        start = time.perf_counter()
        _, seq = window_only.check_call(window_scope, entry, size, 20, now_ms=1)
        python_s.append(time.perf_counter() - start)
        window_only.discard_call(window_scope, seq)
    ping, check = statistics.median(ping_s) * 1e6, statistics.median(check_s) * 1e6
    python = statistics.median(python_s) * 1e6
    call = _median_us(lambda: store.record_call(scope, entry, size, now_ms=1), iterations)
    outcome = _median_us(lambda: store.record_outcome(scope, done, size, None, 1), iterations)
    store.delete_session(scope.session_key)
    store.delete_session(window_scope.session_key)
    return ping, check, call, outcome, python


def main() -> None:
    for size in SIZES:
        evaluate_us, guard_us = detector_cpu_us(size), guard_cpu_us(size)
        print(f"historySize={size}: evaluate CPU {evaluate_us:.1f} us/call; ", end="")
        print(f"before+after on the memory store {guard_us:.1f} us/call")
    with _redis_server() as client:
        for size in SIZES:
            ping, check, call, outcome, python = redis_round_trips_us(client, size)
            target = CHECK_TARGETS[size]
            verdict = "PASS" if check <= target * ping else "MISS"
            print(
                f"historySize={size}: PING {ping:.1f} us, check {check:.1f} us (x{check / ping:.2f} PING; "
                f"<= {target:.0f}x {verdict}); append+window script {call:.1f} us (x{call / ping:.2f}), "
                f"outcome script {outcome:.1f} us (x{outcome / ping:.2f})"
            )
            verdict = "PASS" if python <= target * ping else "MISS"
            print(
                f"  the same check decided in Python from the window (no state in Redis): {python:.1f} us "
                f"(x{python / ping:.2f} PING; <= {target:.0f}x {verdict})"
            )


if __name__ == "__main__":
    main()
