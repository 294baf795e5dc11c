"""What tracing costs a healthy tool call: p50/p99 and throughput, traced and not (``make bench``).

One private redis-server and two ``unstuck worker``s of the same concurrency on two queues:
one started with the standard ``OTEL_*`` variables pointing at an OTLP/HTTP receiver on
loopback (tests/otlp_receiver.py, decoding every export as a collector would), the other
without any. The clients run in a subprocess per phase (``--client``), because whether
tracing is on is decided once per process: the traced client has the same ``OTEL_*``
variables (its ``execute_tool`` spans, the worker's ``unstuck.run`` spans, trace context in
each message and ledger record), the other none.

Each side is measured alone: the other worker is frozen (SIGSTOP) for its phase; phases
alternate over ``--rounds`` rounds and the figures are medians. Per phase: sequential
``noop`` calls on one gateway, p50 / p99; then ``--threads`` gateways in threads, calls/s.
Nothing is asserted; the ratios are printed.

``--hooks``: what tracing costs when it is not configured, which ``make bench`` cannot see
against a call of milliseconds: the CPU time of the hooks one call passes through (the
gateway's ``execute_tool`` guard, ledger fields, message headers and answer listener; the
pool child's ``unstuck.run`` guard), with ``timeit`` in a process without ``OTEL_*``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import psutil

from bench.overhead_probes import freeze, thaw
from tests.harness import REPO, Proc, base_env, kill_pids, start_worker
from tests.otlp_receiver import otlp_receiver
from workers.local.embedded_redis import EmbeddedRedis

_FIGURES = ("p50_ms", "p99_ms", "calls_per_s", "client_cpu_ms", "worker_cpu_ms")


def _tree_cpu_s(worker: Proc) -> float:
    """CPU seconds (user + system) of a worker's main process and its pool children so far."""
    main = psutil.Process(worker.pid)
    total = 0.0
    for process in [main, *main.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def client(label: str, calls: int, threads: int, per_thread: int) -> None:
    """One phase's client (this process's env decides traced or not); prints its figures as JSON."""
    from workers import ToolCall, ToolGateway, tracing

    gateway = ToolGateway()

    def one(gw: ToolGateway, session: str, n: int) -> None:
        (result,) = gw.call_tools(session_key=session, run_id="r", calls=[ToolCall(id=f"c{n}", name="noop")])
        assert result.text == "ok", result

    for n in range(20):  # warm up connections, pool children, imports
        one(gateway, f"{label}-lat", 100_000 + n)
    samples = []
    cpu_start = time.process_time()
    for n in range(calls):
        start = time.perf_counter()
        one(gateway, f"{label}-lat", n)
        samples.append(time.perf_counter() - start)
    client_cpu_ms = (time.process_time() - cpu_start) / calls * 1000
    gateways = [ToolGateway() for _ in range(threads)]
    for t, gw in enumerate(gateways):
        one(gw, f"{label}-tput{t}", 10_000_000)

    def run(t: int) -> None:
        for n in range(per_thread):
            one(gateways[t], f"{label}-tput{t}", n)

    runners = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    start = time.perf_counter()
    for thread in runners:
        thread.start()
    for thread in runners:
        thread.join()
    calls_per_s = threads * per_thread / (time.perf_counter() - start)
    for gw in [gateway, *gateways]:
        gw.close()
    figures = {
        "traced": tracing.active(),
        "p50_ms": _percentile(samples, 0.5) * 1000,
        "p99_ms": _percentile(samples, 0.99) * 1000,
        "calls_per_s": calls_per_s,
        "client_cpu_ms": client_cpu_ms,
        "calls": calls + 20 + threads * (per_thread + 1),
    }
    print(json.dumps(figures))


def hooks(number: int = 200_000, repeat: int = 7) -> None:
    """Print the CPU microseconds per call of the tracing hooks, tracing not configured (JSON)."""
    import timeit
    from types import SimpleNamespace

    import tasks.invoke  # noqa: F401 - what a worker imports (redis-py imports opentelemetry.trace)
    from workers import ToolCall, tracing
    from workers.core.models import TextBlock, ToolResult

    calls = [ToolCall(id="c1", name="noop", arguments={})]
    results = [
        ToolResult(tool_call_id="c1", tool_name="noop", content=(TextBlock(text="ok"),), is_error=False)
    ]
    keys = SimpleNamespace(session_key="s", run_id="r")
    listener = tracing.answer_spans("gateway", None)

    def gateway() -> None:
        with tracing.CallSpans("s", "r", "main", calls) as spans:
            tracing.record_fields("s", "r", "c1")
            tracing.message_headers("s", "r", "c1")
            spans.end(results)
        listener(keys, results[0])

    def worker() -> None:
        with tracing.run_span(SimpleNamespace(), keys, calls[0], 1, flush=False) as run:
            run.ended(results[0])

    def cpu_us(function: Any) -> float:
        best = min(timeit.repeat(function, number=number, repeat=repeat, timer=time.process_time))
        return round(best / number * 1e6, 3)

    figures = {"gateway_us": cpu_us(gateway), "worker_us": cpu_us(worker), "traced": tracing.active()}
    figures["sdk_imported"] = "opentelemetry.sdk.trace" in sys.modules
    print(json.dumps(figures))


def _phase(env: dict[str, str], label: str, args: argparse.Namespace) -> dict[str, float]:
    argv = [sys.executable, "-m", "bench.tracing", "--client", label]
    argv += ["--latency-calls", str(args.latency_calls), "--threads", str(args.threads)]
    argv += ["--calls-per-thread", str(args.calls_per_thread)]
    done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=600, check=True)
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-calls", type=int, default=300)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--calls-per-thread", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument(
        "--hooks", action="store_true", help="the hooks' CPU per call, tracing not configured"
    )
    args = parser.parse_args(argv)
    if args.hooks:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        argv_hooks = [sys.executable, "-c", "from bench.tracing import hooks; hooks()"]
        subprocess.run(argv_hooks, env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO, check=True, timeout=600)
        return
    if args.client:
        client(args.client, args.latency_calls, args.threads, args.calls_per_thread)
        return
    redis_server = EmbeddedRedis().start()
    workers: list[Proc] = []
    with otlp_receiver() as receiver:
        try:
            plain = base_env(redis_server.url, UNSTUCK_BROKER__QUEUE="plain")
            traced = base_env(
                redis_server.url,
                UNSTUCK_BROKER__QUEUE="traced",
                OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
                OTEL_SERVICE_NAME="unstuck-bench",
            )
            plain = {k: v for k, v in plain.items() if not k.startswith("OTEL_")}
            sides = {
                "plain": (plain, start_worker(plain, concurrency=args.concurrency, name="plain")),
                "traced": (traced, start_worker(traced, concurrency=args.concurrency, name="traced")),
            }
            workers.extend(worker for _, worker in sides.values())
            results: dict[str, list[dict[str, float]]] = {"plain": [], "traced": []}
            for round_ in range(args.rounds):
                order = ["plain", "traced"] if round_ % 2 == 0 else ["traced", "plain"]
                for name in order:
                    env, worker = sides[name]
                    other = sides["traced" if name == "plain" else "plain"][1]
                    freeze(other)
                    thaw(worker)
                    worker_cpu = _tree_cpu_s(worker)
                    figures = _phase(env, f"{name}{round_}", args)
                    figures["worker_cpu_ms"] = (_tree_cpu_s(worker) - worker_cpu) / figures["calls"] * 1000
                    assert bool(figures["traced"]) == (name == "traced"), figures
                    results[name].append(figures)
                    print(f"round {round_} {_line(name, figures)}")
                thaw(sides["plain"][1])
                thaw(sides["traced"][1])
            _report(results, len(receiver.spans))
        finally:
            for worker in workers:
                thaw(worker)
                children = worker.children()
                worker.stop()
                kill_pids(children)
            redis_server.close()


def _line(name: str, row: dict[str, float]) -> str:
    return (
        f"{name:6}: p50 {row['p50_ms']:.2f} ms  p99 {row['p99_ms']:.2f} ms  {row['calls_per_s']:.0f} calls/s"
        f"  CPU/call: client {row['client_cpu_ms']:.2f} ms, worker {row['worker_cpu_ms']:.2f} ms"
    )


def _report(results: dict[str, list[dict[str, float]]], spans: int) -> None:
    median = {
        name: {key: statistics.median(r[key] for r in rows) for key in _FIGURES}
        for name, rows in results.items()
    }
    plain, traced = median["plain"], median["traced"]
    for name, row in median.items():
        print(f"medians {_line(name, row)}")
    cpu_ratio = (traced["client_cpu_ms"] + traced["worker_cpu_ms"]) / (
        plain["client_cpu_ms"] + plain["worker_cpu_ms"]
    )
    p50_ratio, tput_ratio = traced["p50_ms"] / plain["p50_ms"], traced["calls_per_s"] / plain["calls_per_s"]
    print(f"traced/plain: p50 x{p50_ratio:.3f}  throughput x{tput_ratio:.3f}  CPU x{cpu_ratio:.3f}")
    print(f"{spans} spans received")


if __name__ == "__main__":
    main()
