"""What waiting for a replica costs healthy calls: ``redis.min_replica_acks`` 0 against 1.

A private primary and one replica on loopback (never the shared Redis). Three sides, each
with its own worker (same concurrency) and, for unstuck, its own queue and key prefix:

* ``bare``: a plain Celery app (:mod:`bench.bare_app`), the baseline of ``make bench``;
* ``acks0``: unstuck with ``redis.min_replica_acks`` 0 (no WAIT);
* ``acks1``: unstuck with ``redis.min_replica_acks`` 1 (WAIT after every registration, claim
  and result, and a fenced read of what is handed on).

Each side is measured alone: the other two workers are frozen (SIGSTOP) for its phase.
Phases rotate their order per round; the figures are medians over ``--rounds`` rounds, and
the ratios are against ``bare`` and ``acks0`` of the same run. Per phase: p50 / p99 of
sequential ``noop`` calls on one client, and the throughput of N threads, each with its own
client. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass

import redis

from bench.bare_app import BARE_QUEUE, URL_ENV
from bench.overhead import Bare, Guarded, Sizes, add_size_arguments, shipped_env, sizes_of, throughput
from bench.overhead_probes import CommandStats, freeze, percentile, thaw, timed_calls, warm_up
from tests.harness import REPO, Proc, base_env, kill_pids, settings_of, start_worker, wait_until
from workers.local.embedded_redis import EmbeddedRedis
from workers.settings import Settings

SIDES = ("bare", "acks0", "acks1")


@dataclass(frozen=True)
class Figures:
    """One side's figures in one round."""

    p50_ms: float
    p99_ms: float
    calls_per_s: float
    commands_per_call: float
    waits_per_call: float


def _parse(argv: list[str] | None) -> Sizes:
    parser = argparse.ArgumentParser(prog="python -m bench.durability", description=__doc__.split("\n")[0])
    add_size_arguments(parser, latency_calls=200, calls_per_thread=40)
    return sizes_of(parser.parse_args(argv))


def _in_sync(port: int) -> bool:
    info = redis.Redis(port=port, socket_timeout=1).info("replication")
    return int(info.get("connected_slaves", 0)) == 1 and info["slave0"]["state"] == "online"


class _Run:
    def __init__(self, opts: Sizes, primary: EmbeddedRedis) -> None:
        self.opts = opts
        bare_url = primary.url.removesuffix("/0") + "/1"
        self.workers: dict[str, Proc] = {}
        self.settings: dict[str, Settings] = {}
        for acks in (0, 1):
            env = base_env(
                primary.url,
                **shipped_env(),
                UNSTUCK_REDIS__MIN_REPLICA_ACKS=str(acks),
                UNSTUCK_REDIS__KEY_PREFIX=f"bench-acks{acks}",
                UNSTUCK_BROKER__QUEUE=f"bench.acks{acks}",
                **{URL_ENV: bare_url},
            )
            self.settings[f"acks{acks}"] = settings_of(env)
            self.workers[f"acks{acks}"] = start_worker(
                env, concurrency=opts.concurrency, name=f"bench-acks{acks}"
            )
        self.bare_url = bare_url
        self.stats = CommandStats(redis.Redis.from_url(primary.url, decode_responses=True))
        bare_env = base_env(primary.url, **{URL_ENV: bare_url})
        self.workers["bare"] = Proc(
            [
                sys.executable, "-m", "celery", "-A", "bench.bare_app", "worker",
                "--pool", "prefork", "--concurrency", str(opts.concurrency),
                "--queues", BARE_QUEUE, "--hostname", "bench-bare@%h", "--loglevel", "INFO",
                "--without-mingle", "--without-gossip",
            ],
            bare_env,
            "bench-bare",
        )  # fmt: skip
        self.workers["bare"].wait_for_log(" ready.", timeout_s=60)

    def client(self, side: str, session: str) -> Bare | Guarded:
        if side == "bare":
            return Bare(self.bare_url)
        return Guarded(self.settings[side], f"bench-{session}")

    def measure(self, side: str, label: str) -> Figures:
        for name, worker in self.workers.items():
            if name != side:
                freeze(worker)
        thaw(self.workers[side])
        client = self.client(side, f"{label}-lat")
        warm_up(client)
        before = self.stats.snapshot()
        samples = timed_calls(client, self.opts.latency_calls)
        commands = CommandStats.delta(before, self.stats.snapshot())
        client.close()
        tput = throughput(
            lambda t: self.client(side, f"{label}-tput{t}"), self.opts.threads, self.opts.calls_per_thread
        )
        calls = self.opts.latency_calls
        return Figures(
            percentile(samples, 0.5) * 1000,
            percentile(samples, 0.99) * 1000,
            tput,
            sum(commands.values()) / calls,
            commands.get("wait", 0) / calls,
        )

    def close(self) -> None:
        for worker in self.workers.values():
            thaw(worker)
        for worker in self.workers.values():
            kill_pids(worker.children())
            worker.stop()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table; exit 0 whatever the figures are."""
    opts = _parse(argv)
    sys.path.insert(0, str(REPO))
    with EmbeddedRedis() as primary:
        replica = EmbeddedRedis(extra_args=("--replicaof", "127.0.0.1", str(primary.port))).start()
        try:
            wait_until(lambda: _in_sync(primary.port), timeout_s=30, what="the replica in sync")
            run = _Run(opts, primary)
            try:
                figures: dict[str, list[Figures]] = {side: [] for side in SIDES}
                for round_no in range(opts.rounds):
                    shift = round_no % len(SIDES)
                    for side in SIDES[shift:] + SIDES[:shift]:
                        figures[side].append(run.measure(side, f"r{round_no}"))
            finally:
                run.close()
        finally:
            replica.close()
    _report(opts, figures)
    return 0


def _report(opts: Sizes, figures: dict[str, list[Figures]]) -> None:
    print(
        f"\ncost of durability: a primary and one replica on loopback; {opts.rounds} rounds (each side "
        f"alone, the other workers frozen), {opts.latency_calls} sequential calls and {opts.threads} "
        f"threads x {opts.calls_per_thread} calls per phase, {opts.concurrency} pool processes per worker"
    )
    names = ("p50_ms", "p99_ms", "calls_per_s", "commands_per_call", "waits_per_call")
    print(f"{'round':<8}{'side':<8}" + "".join(f"{n:>19}" for n in names))
    for n in range(opts.rounds):
        for side in SIDES:
            f = figures[side][n]
            print(f"{n:<8}{side:<8}" + "".join(f"{getattr(f, name):>19.2f}" for name in names))
    med = {
        side: {n: statistics.median(getattr(f, n) for f in figures[side]) for n in names} for side in SIDES
    }
    print(
        f"\nmedians{'':<17}"
        + "".join(f"{side:>10}" for side in SIDES)
        + "  acks0/bare  acks1/bare  acks1/acks0"
    )
    for label, name in (
        ("p50 latency (ms)", "p50_ms"),
        ("p99 latency (ms)", "p99_ms"),
        ("throughput (calls/s)", "calls_per_s"),
        ("Redis cmds per call", "commands_per_call"),
    ):
        b, a0, a1 = med["bare"][name], med["acks0"][name], med["acks1"][name]
        print(
            f"{label:<24}"
            + "".join(f"{v:>10.2f}" for v in (b, a0, a1))
            + f"{a0 / b:>12.2f}{a1 / b:>12.2f}{a1 / a0:>13.2f}"
        )
    waits = {side: med[side]["waits_per_call"] for side in ("acks0", "acks1")}
    print(f"WAITs per call: acks0 {waits['acks0']:.2f}, acks1 {waits['acks1']:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
