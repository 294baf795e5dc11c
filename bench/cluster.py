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

    commands: Counter[str]
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
        assert all(node.process is not None for _, node in nodes)
        before = {label: _sample(node.port, node.process.pid) for label, node in nodes}  # type: ignore[union-attr]
        elapsed = _run_calls(gateways, args.calls_per_thread, "t")
        after = {label: _sample(node.port, node.process.pid) for label, node in nodes}  # type: ignore[union-attr]
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
        n, cpu_us = sum(commands.values()) / calls, cpu_s / calls * 1e6
        per_call[label] = (n, cpu_us)
        top = ", ".join(f"{name} {count / calls:.1f}" for name, count in commands.most_common(6))
        print(f"  {label}: {n:.1f} commands/call, Redis CPU {cpu_us:.0f} µs/call ({top})")
    shards = [per_call[label] for label, _ in nodes if label != "broker"]
    store_commands = sum(n for n, _ in shards)
    store_cpu_us = sum(cpu for _, cpu in shards)
    spread = max(n for n, _ in shards) / (store_commands / len(shards))
    print(f"  store total: {store_commands:.1f} commands/call, {store_cpu_us:.0f} µs Redis CPU/call; "
          f"busiest shard {spread:.2f}x the mean")  # fmt: skip
    _arithmetic(args.rate, args.headroom, store_commands, store_cpu_us, spread, per_call["broker"])


def _arithmetic(
    rate: int, headroom: float, commands: float, cpu_us: float, spread: float, broker: tuple[float, float]
) -> None:
    cores = rate * cpu_us / 1e6
    shards = cores * spread / headroom
    print(f"at {rate} calls/s (shards used to {headroom:.0%} of a core):")
    print(f"  store: {rate * commands / 1e6:.2f} M commands/s, {cores:.1f} cores of Redis main loop -> "
          f"{shards:.0f} shards (x{spread:.2f} for the busiest), "
          f"{rate * commands / max(1, round(shards)) / 1e3:.0f} k commands/s per shard")  # fmt: skip
    broker_cores = rate * broker[1] / 1e6
    print(f"  broker: {rate * broker[0] / 1e6:.2f} M commands/s, {broker_cores:.1f} cores: one Redis "
          f"broker saturates at {headroom * 1e6 / broker[1]:.0f} calls/s -> "
          f"{broker_cores / headroom:.0f} broker Redis (one queue each) or RabbitMQ")  # fmt: skip


if __name__ == "__main__":
    main()
