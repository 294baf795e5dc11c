"""What unstuck's guarantees cost: a guarded no-op tool call versus a bare Celery task (``make bench``).

One run, one private redis-server (never the shared one), two prefork workers with the same
concurrency: ``unstuck worker`` and a bare ``celery worker`` of :mod:`bench.bare_app`.

* latency: sequential calls, bare and guarded alternating, p50 / p99;
* throughput: N client threads (one client each) x M calls, calls per second;
* a hung tool (``sleepy``, soft limit 1 s): how long after the soft limit the result arrives;
* a worker main process SIGKILL mid-call: how long after the kill ``worker_lost`` arrives;
* Redis commands per call on each path (``INFO commandstats`` deltas).

Targets come from issue 2; each is printed PASS or MISS, nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from tests.harness import REPO, Proc, base_env, kill_pids, settings_of, start_worker, wait_until
from workers import ToolCall, ToolGateway
from workers.local.embedded_redis import EmbeddedRedis
from workers.settings import Settings

HUNG_SOFT_S = 1.0  # the soft limit of tests.misbehaving_tools.sleepy


@dataclass(frozen=True)
class Options:
    """Sizes of the run."""

    latency_calls: int
    threads: int
    calls_per_thread: int
    concurrency: int
    lease_ttl_s: float
    trace: bool


def _parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--latency-calls", type=int, default=300)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--calls-per-thread", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=2, help="pool processes of each worker")
    parser.add_argument("--lease-ttl-s", type=float, default=10.0, help="lease TTL (default: unstuck's)")
    parser.add_argument("--trace", action="store_true", help="also print every Redis command of one call")
    args = parser.parse_args(argv)
    return Options(
        args.latency_calls,
        args.threads,
        args.calls_per_thread,
        args.concurrency,
        args.lease_ttl_s,
        args.trace,
    )


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Bare:
    """Client of the bare worker: send the no-op, wait on the result backend."""

    def __init__(self) -> None:
        from bench.bare_app import BARE_QUEUE, BARE_TASK, make_app

        self._app = make_app()
        self._task, self._queue = BARE_TASK, BARE_QUEUE

    def __call__(self, _: int) -> None:
        result = self._app.send_task(self._task, queue=self._queue)
        assert result.get(timeout=30) == "ok"

    def close(self) -> None:
        self._app.close()


class Guarded:
    """Client of the unstuck worker: one ``noop`` tool call per call through the gateway."""

    def __init__(self, settings: Settings, session: str) -> None:
        self._gateway = ToolGateway(settings)
        self._session = session

    def __call__(self, n: int) -> None:
        call = ToolCall(id=f"c{n}", name="noop")
        (result,) = self._gateway.call_tools(session_key=self._session, run_id="r", calls=[call])
        assert result.text == "ok", result

    def close(self) -> None:
        self._gateway.close()


def _timed(operation: Callable[[int], None], n: int) -> float:
    start = time.perf_counter()
    operation(n)
    return time.perf_counter() - start


def latency(bare: Bare, guarded: Guarded, calls: int) -> tuple[list[float], list[float]]:
    """Alternate bare and guarded calls so both see the same machine state."""
    for n in range(20):  # warm up connections, pool children, imports
        bare(n)
        guarded(100_000 + n)
    bare_s, guarded_s = [], []
    for n in range(calls):
        bare_s.append(_timed(bare, n))
        guarded_s.append(_timed(guarded, n))
    return bare_s, guarded_s


def throughput(make_client: Callable[[int], Bare | Guarded], threads: int, per_thread: int) -> float:
    """Calls per second of ``threads`` clients each making ``per_thread`` sequential calls."""
    clients = [make_client(t) for t in range(threads)]
    for t, client in enumerate(clients):
        client(10_000_000 + t)  # connect before the clock starts
    errors: list[BaseException] = []

    def run(client: Bare | Guarded) -> None:
        try:
            for n in range(per_thread):
                client(n)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(c,)) for c in clients]
    start = time.perf_counter()
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    elapsed = time.perf_counter() - start
    for client in clients:
        client.close()
    if errors:
        raise errors[0]
    return threads * per_thread / elapsed


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


class CommandStats:
    """Redis commands executed between two snapshots, by command."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._before: dict[str, int] = {}

    def _snapshot(self) -> dict[str, int]:
        info = self._client.info("commandstats")
        return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}

    @contextmanager
    def measure(self, into: dict[str, int]) -> Iterator[None]:
        before = self._snapshot()
        yield
        after = self._snapshot()
        into.update({k: n - before.get(k, 0) for k, n in after.items() if n - before.get(k, 0) > 0})


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


def _mark(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _print_commands(label: str, counts: dict[str, int], calls: int) -> None:
    total = sum(counts.values()) / calls
    top = sorted(counts.items(), key=lambda kv: -kv[1])
    detail = ", ".join(f"{k} {n / calls:.2f}" for k, n in top if n / calls >= 0.05)
    print(f"  {label:<8} {total:5.1f} commands/call: {detail}")


def _row(label: str, bare: float, guarded: float, target: str) -> None:
    print(f"{label:<22}{bare:>14.2f}{guarded:>12.2f}{guarded / bare:>9.2f}   {target}")


def main(argv: list[str] | None = None) -> int:
    """Run the whole benchmark and print the table; exit 0 whatever the figures are."""
    opts = _parse(argv)
    sys.path.insert(0, str(REPO))
    with EmbeddedRedis() as server:
        env = base_env(
            server.url, UNSTUCK_LEASE__TTL_S=str(opts.lease_ttl_s), UNSTUCK_LEASE__RENEW_INTERVAL_S="0.5"
        )
        settings = settings_of(env)
        unstuck_worker = start_worker(env, concurrency=opts.concurrency, name="bench-unstuck")
        bare_worker = Proc(
            [
                sys.executable, "-m", "celery", "-A", "bench.bare_app", "worker",
                "--pool", "prefork", "--concurrency", str(opts.concurrency),
                "--queues", "bench.bare", "--hostname", "bench-bare@%h", "--loglevel", "INFO",
                "--task-events", "--without-mingle", "--without-gossip",
            ],
            env,
            "bench-bare",
        )  # fmt: skip
        try:
            bare_worker.wait_for_log(" ready.", timeout_s=60)
            _run(opts, settings, server, unstuck_worker)
        finally:
            kill_pids(unstuck_worker.children() + bare_worker.children())
            unstuck_worker.stop()
            bare_worker.stop()
    return 0


def _run(opts: Options, settings: Settings, server: EmbeddedRedis, unstuck_worker: Proc) -> None:
    stats = CommandStats(redis.Redis.from_url(server.url, decode_responses=True))
    bare, guarded = Bare(), Guarded(settings, "bench-latency")
    bare_cmds: dict[str, int] = {}
    guarded_cmds: dict[str, int] = {}
    probe = 50
    with stats.measure(bare_cmds):
        for n in range(probe):
            bare(1_000_000 + n)
    with stats.measure(guarded_cmds):
        for n in range(probe):
            guarded(1_000_000 + n)
    bare_s, guarded_s = latency(bare, guarded, opts.latency_calls)
    bare.close()
    guarded.close()
    bare_tput = throughput(lambda _: Bare(), opts.threads, opts.calls_per_thread)
    guarded_tput = throughput(
        lambda t: Guarded(settings, f"bench-tput-{t}"), opts.threads, opts.calls_per_thread
    )
    if opts.trace:
        tracer_bare, tracer = Bare(), Guarded(settings, "bench-trace")
        tracer_bare(1)  # connect first: trace a warm call
        tracer(1)
        trace_one_call(server.url, "bare celery no-op", lambda: tracer_bare(0))
        trace_one_call(server.url, "guarded noop tool call", lambda: tracer(0))
        tracer_bare.close()
        tracer.close()
    hung_ms = hung_tool_overshoot_ms(settings)
    kill_s = worker_kill_s(settings, unstuck_worker)

    b50, b99 = _percentile(bare_s, 0.5) * 1000, _percentile(bare_s, 0.99) * 1000
    g50, g99 = _percentile(guarded_s, 0.5) * 1000, _percentile(guarded_s, 0.99) * 1000
    tput = guarded_tput / bare_tput
    print(
        f"\nunstuck overhead: {opts.latency_calls} sequential calls each, {opts.threads} threads x "
        f"{opts.calls_per_thread} calls, {opts.concurrency} pool processes per worker"
    )
    print(f"{'':<22}{'bare celery':>14}{'guarded':>12}{'ratio':>9}   target")
    _row("p50 latency (ms)", b50, g50, f"<= 1.25  {_mark(g50 / b50 <= 1.25)}")
    _row("p99 latency (ms)", b99, g99, "")
    _row("throughput (calls/s)", bare_tput, guarded_tput, f">= 0.85  {_mark(tput >= 0.85)}")
    worst_hung = max(hung_ms)
    print(
        f"hung tool (soft {HUNG_SOFT_S:.0f} s): result at soft + {statistics.median(hung_ms):.0f} ms median, "
        f"+{worst_hung:.0f} ms worst of {len(hung_ms)}   <= +100 ms  {_mark(worst_hung <= 100)}"
    )
    print(
        f"worker SIGKILL: worker_lost {kill_s:.2f} s after the kill (lease TTL {opts.lease_ttl_s:.0f} s)   "
        f"<= TTL + 1 s  {_mark(kill_s <= opts.lease_ttl_s + 1)}"
    )
    print(f"Redis commands per call ({probe} sequential calls, all clients and workers):")
    _print_commands("bare", bare_cmds, probe)
    _print_commands("guarded", guarded_cmds, probe)


if __name__ == "__main__":
    raise SystemExit(main())
