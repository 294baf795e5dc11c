"""Redis commands and CPU per guarded call on each shard of a Redis Cluster (``python -m bench.cluster``).

Starts a private 3-master Redis Cluster (``tests.harness.LocalCluster``) for the store, a
single redis-server as Celery's broker (kombu cannot use a cluster), a real ``unstuck
worker`` and a gateway, then runs guarded no-op calls, each on its own session and run (as
many agents would), a few threads at a time. Per Redis process it reads the ``INFO
commandstats`` deltas (commands per call, by command) and the process's CPU seconds from
``/proc`` (the single-threaded main loop is what saturates a Redis first), then prints the
arithmetic for a target rate (default 100 000 calls/s): store shards needed at a given CPU
headroom per shard, commands per second per shard, and broker capacity. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass

import redis

from tests.harness import LocalCluster, base_env, register_cluster, settings_of, start_worker
from workers import ToolCall, ToolGateway
from workers.local.embedded_redis import EmbeddedRedis

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sample:
    """One Redis process's counters at one moment."""

    commands: Counter[str]  # executed, by name, script-internal calls included (commandstats)
    cpu_s: float


def _sample(port: int, pid: int) -> Sample:
    client = redis.Redis(port=port, decode_responses=True)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    commands: Counter[str] = Counter()
    for name, row in stats.items():
        commands[name.removeprefix("cmdstat_")] = int(row["calls"])
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return Sample(commands, (int(fields[11]) + int(fields[12])) / TICKS)  # utime + stime


def _calls(gateway: ToolGateway, thread: str, n: int) -> None:
    # Each call on a run of its own, as one step of many agents would be.
    for i in range(n):
        call = ToolCall(id="c1", name="echo", arguments={"text": "x"})
        results = gateway.call_tools(session_key=f"bench:t{thread}:s{i}", run_id="r1", calls=[call])
        assert results[0].text == "x", results[0]


def _run_calls(gateways: list[ToolGateway], per_thread: int, batch: str) -> float:
    """Each gateway (one per thread: one client each) makes ``per_thread`` calls; wall seconds."""
    workers = [
        threading.Thread(target=_calls, args=(gateway, f"{batch}{t}", per_thread))
        for t, gateway in enumerate(gateways)
    ]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return time.perf_counter() - started


def _delta(before: Sample, after: Sample) -> tuple[Counter[str], float]:
    commands = Counter({k: after.commands[k] - before.commands.get(k, 0) for k in after.commands})
    # INFO itself is the bench's own reading, not the system's
    commands.pop("info", None)
    return +commands, after.cpu_s - before.cpu_s


def _idle_cpu_per_s(nodes: list[tuple[str, EmbeddedRedis]], seconds: float) -> dict[str, float]:
    """Each Redis process's CPU seconds per second with no calls (its cron, our workers' polls)."""
    before = {label: _sample(node.port, _pid(node)).cpu_s for label, node in nodes}
    time.sleep(seconds)  # measuring idle time is the point: nothing to await
    return {label: (_sample(node.port, _pid(node)).cpu_s - before[label]) / seconds for label, node in nodes}


def _pid(node: EmbeddedRedis) -> int:
    assert node.process is not None
    return node.process.pid


def _capacity(port: int) -> float:
    """Requests/s one shard serves to 50 unpipelined clients (redis-benchmark, on this machine)."""
    cli = shutil.which("redis-benchmark")
    if cli is None:
        return 0.0
    argv = [cli, "-p", str(port), "-c", "50", "-n", "100000", "-q", "hset", "bench:{x}", "f", "v"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False).stdout
    found = re.findall(r"([0-9.]+) requests per second", out)
    return float(found[-1]) if found else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--calls-per-thread", type=int, default=100)
    parser.add_argument("--rate", type=int, default=100_000, help="target calls per second")
    parser.add_argument("--headroom", type=float, default=0.5, help="share of a core one shard may use")
    args = parser.parse_args()
    calls = args.threads * args.calls_per_thread
    broker = EmbeddedRedis().start()
    cluster = LocalCluster().start()
    register_cluster(cluster.url, broker.url)
    env = base_env(cluster.url, UNSTUCK_LEASE__TTL_S="10", UNSTUCK_LEASE__RENEW_INTERVAL_S="3")
    worker = start_worker(env, concurrency=2)
    settings = settings_of(env)
    gateways = [ToolGateway(settings) for _ in range(args.threads)]
    try:
        _run_calls(gateways, 5, "warm")  # scripts loaded, connections open
        nodes = [(f"shard {n + 1}", node) for n, node in enumerate(cluster.nodes)] + [("broker", broker)]
        idle = _idle_cpu_per_s(nodes, 5.0)
        before = {label: _sample(node.port, _pid(node)) for label, node in nodes}
        elapsed = _run_calls(gateways, args.calls_per_thread, "t")
        after = {label: _sample(node.port, _pid(node)) for label, node in nodes}
        capacity = _capacity(broker.port)  # a Redis like every shard, with no MOVED replies
    finally:
        for gateway in gateways:
            gateway.close()
        worker.stop()
        cluster.close()
        broker.close()
    print(f"{calls} guarded no-op calls, {args.threads} threads, each call on its own session, "
          f"{calls / elapsed:.0f} calls/s on this machine")  # fmt: skip
    per_call: dict[str, tuple[float, float]] = {}
    for label, _ in nodes:
        commands, cpu_s = _delta(before[label], after[label])
        cpu_us = max(0.0, cpu_s - idle[label] * elapsed) / calls * 1e6
        run = sum(commands.values()) / calls
        per_call[label] = (run, cpu_us)
        top = ", ".join(f"{name} {count / calls:.1f}" for name, count in commands.most_common(6))
        print(f"  {label}: {run:.1f} commands/call ({commands['evalsha'] / calls:.1f} script calls; "
              f"in-script commands count: {top}); Redis CPU {cpu_us:.0f} µs/call above idle")  # fmt: skip
    shards = [per_call[label] for label, _ in nodes if label != "broker"]
    store_commands = sum(n for n, _ in shards)
    store_cpu_us = sum(cpu for _, cpu in shards)
    spread = max(n for n, _ in shards) / (store_commands / len(shards))
    print(f"  store total: {store_commands:.1f} commands/call, {store_cpu_us:.0f} µs Redis CPU/call; "
          f"busiest shard {spread:.2f}x the mean; one Redis serves {capacity:.0f} HSET/s to 50 clients "
          f"(redis-benchmark on the broker, this machine)")  # fmt: skip
    _arithmetic(
        args.rate, args.headroom, (store_commands, store_cpu_us), spread, per_call["broker"], capacity
    )


def _arithmetic(
    rate: int,
    headroom: float,
    store: tuple[float, float],
    spread: float,
    broker: tuple[float, float],
    capacity: float,
) -> None:
    """Shards for ``rate`` calls/s two ways: by measured Redis CPU, and by commands at ``capacity``."""
    commands, cpu_us = store
    store_spread = spread
    print(f"at {rate} calls/s, each Redis at {headroom:.0%} of its core, the busiest shard {spread:.2f}x:")
    for label, (sent, micros) in (("store", (commands, cpu_us)), ("broker", broker)):
        by_cpu = rate * micros / 1e6 * spread / headroom
        by_commands = rate * sent * spread / (capacity * headroom) if capacity else float("nan")
        print(f"  {label}: {rate * sent / 1e6:.2f} M commands/s; by CPU ({micros:.0f} µs/call) {by_cpu:.0f} "
              f"Redis; by commands at {capacity:.0f}/s each {by_commands:.0f} Redis, "
              f"{capacity * headroom / 1e3:.0f} k commands/s each")  # fmt: skip
        spread = 1.0  # the broker is one process per queue: no spread over shards
    if not capacity:
        return
    # The store grows by shards; one queue lives on one broker Redis whatever its size.
    broker_ceiling = capacity * headroom / broker[0]
    per_shard = capacity * headroom / (commands * store_spread)
    first = "the broker (one Redis per queue)" if broker_ceiling < rate else "the store's shard count"
    print(f"  ceilings by commands: one broker Redis {broker_ceiling:.0f} calls/s; each store shard adds "
          f"{per_shard:.0f} calls/s; first to saturate: {first}")  # fmt: skip


if __name__ == "__main__":
    main()
