"""Watchdog sweep cost with 100 000 sessions and 10 000 due items (``python -m bench.watchdog``).

Starts its own redis-server on a free loopback port (never the shared one) and stops it at
the end. 100 000 running runs hold their lanes; 90 000 progressed recently (not due), 10 000
have had no indexed progress for longer than ``stalled_after_s`` and each runs one call
that heartbeats (so the sweep must read real activity and finds them ``long_running``).
Those 10 000 calls are also the due index. Baseline, in the same run: one bare
``ZRANGEBYSCORE`` of the 10 000 due runs. Before each timed sweep the due runs' index
scores are put back, so every repetition does the full work. ``BENCH_PATH=pipelined``
measures the cluster-safe path instead of the server-side scripts.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import redis

from workers.alerts import AlertSink
from workers.settings import Settings
from workers.store.embedded import EmbeddedRedis
from workers.store.keys import SessionKeys, due_index_key, run_index_keys, run_member
from workers.store.ledger import Ledger, connect
from workers.store.sessions import SessionStore
from workers.watchdog import Watchdog

SESSIONS = int(os.environ.get("BENCH_SESSIONS", "100000"))
DUE = int(os.environ.get("BENCH_DUE", "10000"))
STALLED_AFTER_S = 120.0
REPEATS = 5
PREFIX = "unstuck"


def _populate(client: redis.Redis, now: int) -> dict[str, int]:
    index = run_index_keys(PREFIX)
    ledger = Ledger(client, prefix=PREFIX, ttl_s=3600, lease_ttl_ms=60_000)
    old = now - int(STALLED_AFTER_S * 1000) - 60_000
    due_scores: dict[str, int] = {}
    pipe = client.pipeline(transaction=False)
    for n in range(SESSIONS):
        session, run = f"agent:main:s{n}", "r1"
        keys = ledger.keys(session, run)
        due = n < DUE
        progress = old if due else now - 1000
        pipe.hset(keys.run, mapping={"started_ms": old, "deadline_ms": now + 3_600_000, "agent_id": "main",
                                     "status": "running", "token": 1, "progress_ms": progress})  # fmt: skip
        pipe.expire(keys.run, 3600)
        lane = SessionKeys(PREFIX, session).lane
        pipe.hset(lane, mapping={"run_id": run, "token": 1, "agent_id": "main", "since_ms": old,
                                 "lease_until_ms": now + 3_660_000})  # fmt: skip
        pipe.pexpireat(lane, now + 3_660_000)
        member = run_member(session, run)
        pipe.zadd(index.by_deadline, {member: now + 3_600_000})
        pipe.zadd(index.by_progress, {member: progress})
        if due:
            due_scores[member] = progress
            call: dict[Any, Any] = {
                "call_id": "c1", "tool": "exec", "state": "running", "submitted_ms": old, "started_ms": old,
                "hb_ms": now - 500, "deadline_ms": now + 600_000, "attempt": 1, "dispatched": "1",
            }  # fmt: skip
            pipe.hset(keys.call("c1"), mapping=call)
            pipe.expire(keys.call("c1"), 3600)
            pipe.zadd(keys.calls, {"c1": old})
            pipe.zadd(keys.open, {"c1": now + 600_000})
            pipe.expire(keys.calls, 3600)
            pipe.expire(keys.open, 3600)
            pipe.set(keys.lease("c1"), "w:1", px=3_600_000)
            pipe.zadd(due_index_key(PREFIX), {keys.due_member("c1"): now + 600_000})
        if n % 2000 == 1999:
            pipe.execute()
    pipe.execute()
    return due_scores


def main() -> None:
    with EmbeddedRedis() as server:
        client = connect(server.url, socket_timeout_s=30, socket_connect_timeout_s=2)
        now = int(time.time() * 1000)
        started = time.perf_counter()
        due_scores = _populate(client, now)
        print(f"populated {SESSIONS} sessions, {DUE} due, in {time.perf_counter() - started:.1f} s")
        settings = Settings(redis={"url": server.url}, watchdog={"stalled_after_s": STALLED_AFTER_S})
        store = SessionStore(Ledger(client, prefix=PREFIX, ttl_s=3600, lease_ttl_ms=60_000))
        server_side = os.environ.get("BENCH_PATH", "scripts") != "pipelined"
        watchdog = Watchdog(
            store, settings, writer="bench/watchdog", alerts=AlertSink(), server_side=server_side
        )
        index = run_index_keys(PREFIX)
        before = now - int(STALLED_AFTER_S * 1000)
        baseline, sweeps = [], []
        phases: dict[str, list[float]] = {}
        for _ in range(REPEATS):
            client.zadd(index.by_progress, due_scores)
            t0 = time.perf_counter()
            found = client.zrangebyscore(index.by_progress, "-inf", before, withscores=True)
            baseline.append(time.perf_counter() - t0)
            assert len(found) == DUE, len(found)
            t0 = time.perf_counter()
            report = watchdog.sweep(now)
            sweeps.append(time.perf_counter() - t0)
            assert report.classes == {"long_running": DUE}, report
            for name, ms in report.phases_ms.items():
                phases.setdefault(name, []).append(ms)
        base_ms, sweep_ms = statistics.median(baseline) * 1000, statistics.median(sweeps) * 1000
        print(f"baseline ZRANGEBYSCORE of {DUE} due runs: {base_ms:.1f} ms (median of {REPEATS})")
        spread = f"min {min(sweeps) * 1000:.1f}, max {max(sweeps) * 1000:.1f}"
        print(f"full sweep ({DUE} due calls probed, {DUE} due runs read and classified): "
              f"{sweep_ms:.1f} ms (median of {REPEATS}; {spread})")  # fmt: skip
        path = "server-side scripts" if watchdog.scripts is not None else "pipelined (cluster-safe)"
        breakdown = ", ".join(f"{name} {statistics.median(ms):.1f}" for name, ms in phases.items())
        print(f"phases ({path}; median ms): {breakdown}")
        print(f"ratio sweep / baseline: {sweep_ms / base_ms:.1f}x; target <= 100 ms: "
              f"{'met' if sweep_ms <= 100 else 'NOT met'}")  # fmt: skip
        client.close()


if __name__ == "__main__":
    main()
