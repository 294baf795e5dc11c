"""What unstuck's guarantees cost next to a plain Celery app (``make bench``).

One private redis-server (never the shared one) and two prefork workers with the same
concurrency: ``unstuck worker`` and a bare ``celery worker`` of :mod:`bench.bare_app`, a
Celery app configured as Celery's docs show (Redis broker and result backend, JSON,
``.get()``), not through unstuck's settings. Both workers run ``--without-mingle
--without-gossip``, as ``unstuck worker`` does, so neither side pays for cluster chatter.

Each side is measured alone: the other worker is frozen (SIGSTOP) for the whole phase, so
its background work (lease keepers, post-call writes, broker polls) cannot land on the
measured side's clock. Phases alternate (bare first in even rounds, guarded first in odd),
and the figures are medians over ``--rounds`` rounds. Per phase:

* latency: sequential calls on one client and one session, p50 / p99;
* CPU per call: user + system seconds of every process over the sequential calls (this
  client, the worker's main process and pool children, redis-server), divided by the calls;
* Redis commands per call: ``INFO commandstats`` delta over the same calls;
* throughput: N threads, each with its own client (and, guarded, its own session), calls/s.

The guarded call is measured on four paths, each a side of its own against the same bare
figures: the sync gateway (``call_tools``, the targets' path), asyncio (``acall_tools``), the
HTTP door (``unstuck serve``) and the MCP door (``unstuck mcp``), see
:mod:`bench.overhead_doors`. A door's process counts in the CPU per call; doors not measured
are frozen with the workers.

Then, once: a hung tool's overshoot past its soft limit and the time from a worker SIGKILL
to ``worker_lost``. Every target is printed PASS or MISS; nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from bench.bare_app import BARE_QUEUE, BARE_TASK, URL_ENV, make_app
from bench.overhead_doors import (
    AsyncGuarded,
    HttpGuarded,
    McpGuarded,
    async_throughput,
    start_http_door,
    start_mcp_door,
)
from bench.overhead_probes import (
    HUNG_SOFT_S,
    CommandStats,
    CpuMeter,
    freeze,
    hung_tool_overshoot_ms,
    percentile,
    thaw,
    timed_calls,
    trace_one_call,
    warm_up,
    worker_kill_s,
)
from tests.harness import REPO, Proc, base_env, kill_pids, settings_of, start_worker
from workers import ToolCall, ToolGateway
from workers.local.embedded_redis import EmbeddedRedis
from workers.settings import LeaseSettings, Settings, WorkerSettings

Client = Callable[[int], None]

# The sync path's targets against bare Celery (issue 46): each a ratio, but commands per call,
# an absolute count of every Redis command a call costs (those run inside scripts included).
P50_TARGET, TPUT_TARGET, CPU_TARGET, COMMANDS_TARGET = 0.9, 1.0, 1.0, 22.0
PATHS = ("guarded", "asyncio", "http", "mcp")


@dataclass(frozen=True)
class Sizes:
    """Sizes of a run that measures sides alone: rounds, sequential calls, threads, pool."""

    rounds: int
    latency_calls: int
    threads: int
    calls_per_thread: int
    concurrency: int


def add_size_arguments(parser: argparse.ArgumentParser, *, latency_calls: int, calls_per_thread: int) -> None:
    """The command-line options of :class:`Sizes`, with this benchmark's defaults."""
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each side alone (median)")
    parser.add_argument("--latency-calls", type=int, default=latency_calls)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--calls-per-thread", type=int, default=calls_per_thread)
    parser.add_argument("--concurrency", type=int, default=2, help="pool processes of each worker")


def sizes_of(args: argparse.Namespace) -> Sizes:
    """The :class:`Sizes` parsed by :func:`add_size_arguments`."""
    return Sizes(args.rounds, args.latency_calls, args.threads, args.calls_per_thread, args.concurrency)


@dataclass(frozen=True)
class Options(Sizes):
    """Sizes of the run, the lease TTL (None: unstuck's default) and what to print besides."""

    lease_ttl_s: float | None
    trace: bool
    faults: bool
    paths: tuple[str, ...]


def _parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.split("\n")[0])
    add_size_arguments(parser, latency_calls=300, calls_per_thread=60)
    parser.add_argument("--lease-ttl-s", type=float, default=None, help="lease TTL (default: unstuck's)")
    parser.add_argument("--trace", action="store_true", help="also print every Redis command of one call")
    parser.add_argument("--no-faults", action="store_true", help="skip the hung-tool and SIGKILL figures")
    parser.add_argument(
        "--paths",
        default=",".join(PATHS[1:]),
        help=f"paths besides the sync gateway, comma-separated, of {','.join(PATHS[1:])} ('' for none)",
    )
    args = parser.parse_args(argv)
    sizes = sizes_of(args)
    paths = tuple(p for p in args.paths.split(",") if p)
    unknown = set(paths) - set(PATHS[1:])
    if unknown:
        parser.error(f"unknown paths: {sorted(unknown)}")
    return Options(
        **vars(sizes), lease_ttl_s=args.lease_ttl_s, trace=args.trace, faults=not args.no_faults, paths=paths
    )


class Bare:
    """Client of the bare worker: ``send_task(...).get()``, as a Celery user waits for a result."""

    def __init__(self, url: str) -> None:
        self._app = make_app(url)

    def __call__(self, _: int) -> None:
        assert self._app.send_task(BARE_TASK, queue=BARE_QUEUE).get(timeout=30) == "ok"

    def close(self) -> None:
        self._app.close()


class Guarded:
    """Client of the unstuck worker: one ``noop`` tool call per call through its own gateway."""

    def __init__(self, settings: Settings, session: str) -> None:
        self._gateway = ToolGateway(settings)
        self._session = session

    def __call__(self, n: int) -> None:
        call = ToolCall(id=f"c{n}", name="noop")
        (result,) = self._gateway.call_tools(session_key=self._session, run_id="r", calls=[call])
        assert result.text == "ok", result

    def close(self) -> None:
        self._gateway.close()


AnyClient = Bare | Guarded | AsyncGuarded | HttpGuarded | McpGuarded


@dataclass
class Side:
    """One system or path: its worker (and door), how to make a client on a fresh session.

    ``throughput``: how its throughput is measured, when not by one thread per client.
    """

    name: str
    worker: Proc
    client: Callable[[str], AnyClient]
    door: Proc | None = None
    throughput: Callable[[str, Sizes], float] | None = None

    def processes(self) -> list[Proc]:
        """What runs for this side: its worker, and its door if any."""
        return [self.worker] + ([self.door] if self.door else [])


@dataclass
class Phase:
    """One side's figures in one round."""

    p50_ms: float
    p99_ms: float
    cpu_ms_per_call: float
    commands_per_call: float
    calls_per_s: float
    commands: dict[str, int] = field(default_factory=dict)
    cpu_ms_by_role: dict[str, float] = field(default_factory=dict)
    #: Cores each process kept busy during the throughput phase (CPU seconds / wall seconds).
    cores_by_role: dict[str, float] = field(default_factory=dict)


def throughput(make_client: Callable[[int], AnyClient], threads: int, per_thread: int) -> float:
    """Calls per second of ``threads`` clients each making ``per_thread`` sequential calls."""
    clients = [make_client(t) for t in range(threads)]
    for client in clients:
        client(10_000_000)  # connect before the clock starts
    errors: list[BaseException] = []

    def run(client: AnyClient) -> None:
        try:
            for n in range(per_thread):
                client(n)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    runners = [threading.Thread(target=run, args=(c,)) for c in clients]
    start = time.perf_counter()
    for thread in runners:
        thread.start()
    for thread in runners:
        thread.join()
    elapsed = time.perf_counter() - start
    for client in clients:
        client.close()
    if errors:
        raise errors[0]
    return threads * per_thread / elapsed


def measure(
    side: Side, others: list[Proc], label: str, opts: Options, cpu: CpuMeter, stats: CommandStats
) -> Phase:
    """One phase: ``side`` alone (``others`` frozen), latency + CPU + commands, then throughput."""
    mine = side.processes()
    for proc in others:
        if proc not in mine:
            freeze(proc)
    for proc in mine:
        thaw(proc)
    client = side.client(f"{label}-lat")
    warm_up(client)
    cpu_before, commands_before = cpu.sample(), stats.snapshot()
    samples = timed_calls(client, opts.latency_calls)
    cpu_after, commands = cpu.sample(), CommandStats.delta(commands_before, stats.snapshot())
    client.close()
    calls = opts.latency_calls
    tput_cpu_before, tput_started = cpu.sample(), time.perf_counter()
    if side.throughput is not None:
        tput = side.throughput(f"{label}-tput", opts)
    else:
        tput = throughput(lambda t: side.client(f"{label}-tput{t}"), opts.threads, opts.calls_per_thread)
    # The phase's clock includes its clients' connecting: a few calls' worth, against thousands.
    tput_wall_s = time.perf_counter() - tput_started
    busy = {role: s / tput_wall_s for role, s in CpuMeter.spent(tput_cpu_before, cpu.sample()).items()}
    cpu_ms = {role: s / calls * 1000 for role, s in CpuMeter.spent(cpu_before, cpu_after).items()}
    return Phase(
        percentile(samples, 0.5) * 1000,
        percentile(samples, 0.99) * 1000,
        sum(cpu_ms.values()),
        sum(commands.values()) / calls,
        tput,
        dict(commands),
        cpu_ms,
        busy,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the whole benchmark and print the table; exit 0 whatever the figures are."""
    opts = _parse(argv)
    sys.path.insert(0, str(REPO))
    with EmbeddedRedis() as server:
        assert server.process is not None
        bare_url = server.url.removesuffix("/0") + "/1"  # its own database, on the same server
        env = base_env(server.url, **shipped_env(opts.lease_ttl_s), **{URL_ENV: bare_url})
        settings = settings_of(env)
        unstuck_worker = start_worker(env, concurrency=opts.concurrency, name="bench-unstuck")
        bare_worker = Proc(
            [
                sys.executable, "-m", "celery", "-A", "bench.bare_app", "worker",
                "--pool", "prefork", "--concurrency", str(opts.concurrency),
                "--queues", BARE_QUEUE, "--hostname", "bench-bare@%h", "--loglevel", "INFO",
                "--without-mingle", "--without-gossip",
            ],
            env,
            "bench-bare",
        )  # fmt: skip
        doors: list[Proc] = []
        try:
            bare_worker.wait_for_log(" ready.", timeout_s=60)
            bare = Side("bare", bare_worker, lambda _: Bare(bare_url))
            sides = [Side("guarded", unstuck_worker, lambda s: Guarded(settings, f"bench-{s}"))]
            if "asyncio" in opts.paths:
                sides.append(
                    Side(
                        "asyncio",
                        unstuck_worker,
                        lambda s: AsyncGuarded(settings, f"bench-{s}"),
                        throughput=lambda label, o: async_throughput(
                            settings, label, o.threads, o.calls_per_thread
                        ),
                    )
                )
            if "http" in opts.paths:
                http_door, http_port = start_http_door(env)
                doors.append(http_door)
                sides.append(
                    Side("http", unstuck_worker, lambda s: HttpGuarded(http_port, f"bench-{s}"), http_door)
                )
            if "mcp" in opts.paths:
                mcp_door, mcp_port = start_mcp_door(env)
                doors.append(mcp_door)
                sides.append(Side("mcp", unstuck_worker, lambda _: McpGuarded(mcp_port), mcp_door))
            _run(opts, settings, server, bare, sides)
        finally:
            for proc in (unstuck_worker, bare_worker, *doors):
                thaw(proc)
            kill_pids(unstuck_worker.children() + bare_worker.children())
            for proc in (*doors, unstuck_worker, bare_worker):
                proc.stop()
    return 0


def shipped_env(lease_ttl_s: float | None = None) -> dict[str, str]:
    """The settings the test harness changes, back at unstuck's shipped defaults (a lease TTL if given).

    The harness shortens the lease (the SIGKILL figure is about the shipped one) and turns on
    the worker's line per task (which costs a tenth of its throughput).
    """
    shipped = LeaseSettings()
    if lease_ttl_s is None:
        ttl_s, renew_s = shipped.ttl_s, shipped.renew_interval_s
    else:
        ttl_s, renew_s = lease_ttl_s, min(shipped.renew_interval_s, lease_ttl_s / 2)
    return {
        "UNSTUCK_LEASE__TTL_S": str(ttl_s),
        "UNSTUCK_LEASE__RENEW_INTERVAL_S": str(renew_s),
        "UNSTUCK_WORKER__LOG_EACH_TASK": str(WorkerSettings().log_each_task).lower(),
    }


def _run(opts: Options, settings: Settings, server: EmbeddedRedis, bare: Side, sides: list[Side]) -> None:
    assert server.process is not None
    stats = CommandStats(redis.Redis.from_url(server.url, decode_responses=True))
    everyone = [bare, *sides]
    processes = list({id(p): p for side in everyone for p in side.processes()}.values())
    phases: dict[str, list[Phase]] = {side.name: [] for side in everyone}
    for round_no in range(opts.rounds):
        # Bare first in even rounds, last in odd ones; the paths take turns in between.
        order = [bare, *sides] if round_no % 2 == 0 else [*sides[::-1], bare]
        for side in order:
            door_pid = side.door.pid if side.door else None
            cpu = CpuMeter(side.worker.pid, server.process.pid, door_pid)
            # Sessions named after the side too: a path must not find another's answered calls.
            label = f"{side.name}-r{round_no}"
            phases[side.name].append(measure(side, processes, label, opts, cpu, stats))
    _report(opts, phases)
    guarded = sides[0]
    for proc in processes:
        if proc is not guarded.worker:
            freeze(proc)
    thaw(guarded.worker)
    if opts.trace:
        _trace(settings, server.url)
        mcp = next((side for side in sides if side.name == "mcp"), None)
        if mcp is not None and mcp.door is not None:
            _trace_mcp(server.url, mcp)
    if opts.faults:
        _faults(opts, settings, guarded.worker)


def _trace(settings: Settings, url: str) -> None:
    thaw_guarded = Guarded(settings, "bench-trace")
    thaw_guarded(1)  # connect first: trace a warm call
    trace_one_call(url, "guarded noop tool call", lambda: thaw_guarded(0))
    thaw_guarded.close()


def _trace_mcp(url: str, side: Side) -> None:
    """Trace one MCP door call (its door thawed while traced): the commands of a run per call."""
    assert side.door is not None
    thaw(side.door)
    client = side.client("trace")
    try:
        client(1)  # connect first: trace a warm call
        trace_one_call(url, "mcp door noop tool call", lambda: client(0))
    finally:
        client.close()
        freeze(side.door)


def _faults(opts: Options, settings: Settings, worker: Proc) -> None:
    hung_ms = hung_tool_overshoot_ms(settings)
    kill_s = worker_kill_s(settings, worker)
    ttl_s = settings.lease.ttl_s
    worst = max(hung_ms)
    print(
        f"hung tool (soft {HUNG_SOFT_S:.0f} s): result at soft + {statistics.median(hung_ms):.0f} ms median, "
        f"+{worst:.0f} ms worst of {len(hung_ms)}   <= +100 ms  {_mark(worst <= 100)}"
    )
    print(
        f"worker SIGKILL: worker_lost {kill_s:.2f} s after the kill (lease TTL {ttl_s:g} s)   "
        f"<= TTL + 1 s  {_mark(kill_s <= ttl_s + 1)}"
    )


def _mark(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _median(phases: list[Phase], figure: str) -> float:
    return statistics.median(float(getattr(p, figure)) for p in phases)


def _report(opts: Options, phases: dict[str, list[Phase]]) -> None:
    print(
        f"\nunstuck overhead vs plain Celery: {opts.rounds} rounds (each side alone, the other workers "
        f"and doors frozen), {opts.latency_calls} sequential calls and {opts.threads} clients x "
        f"{opts.calls_per_thread} calls per phase, {opts.concurrency} pool processes per worker"
    )
    figures = ("p50_ms", "p99_ms", "calls_per_s", "cpu_ms_per_call", "commands_per_call")
    names = list(phases)
    print(f"{'round':<8}{'side':<9}" + "".join(f"{f:>19}" for f in figures))
    for n in range(opts.rounds):
        for name in names:
            p = phases[name][n]
            print(f"{n:<8}{name:<9}" + "".join(f"{getattr(p, f):>19.2f}" for f in figures))
    medians = {name: {f: _median(phases[name], f) for f in figures} for name in names}
    bare, guarded = medians["bare"], medians["guarded"]
    print(f"\nsync path (call_tools), medians{'':<0}{'bare celery':>14}{'guarded':>12}{'ratio':>9}   target")
    rows = (
        ("p50 latency (ms)", "p50_ms", f"<= {P50_TARGET}", lambda r, _: r <= P50_TARGET),
        ("p99 latency (ms)", "p99_ms", "", None),
        ("throughput (calls/s)", "calls_per_s", f">= {TPUT_TARGET}", lambda r, _: r >= TPUT_TARGET),
        ("CPU per call (ms)", "cpu_ms_per_call", f"<= {CPU_TARGET}x", lambda r, _: r <= CPU_TARGET),
        (
            "Redis cmds per call",
            "commands_per_call",
            f"<= {COMMANDS_TARGET:g}",
            lambda _, g: g <= COMMANDS_TARGET,
        ),
    )
    for label, figure, target, ok in rows:
        b, g = bare[figure], guarded[figure]
        verdict = f"{target}  {_mark(ok(g / b, g))}" if ok else ""
        print(f"{label:<32}{b:>14.2f}{g:>12.2f}{g / b:>9.2f}   {verdict}")
    print("\nevery path against bare Celery (medians; ratio = path / bare; the targets are the sync path's)")
    print(
        f"{'path':<10}{'p50 ratio':>11}{'tput ratio':>12}{'CPU ratio':>11}"
        f"{'CPU ms/call':>13}{'cmds/call':>11}"
    )
    for name in names:
        m = medians[name]
        print(
            f"{name:<10}{m['p50_ms'] / bare['p50_ms']:>11.2f}{m['calls_per_s'] / bare['calls_per_s']:>12.2f}"
            f"{m['cpu_ms_per_call'] / bare['cpu_ms_per_call']:>11.2f}{m['cpu_ms_per_call']:>13.2f}"
            f"{m['commands_per_call']:>11.2f}"
        )
    _by_role("CPU ms per call by process (medians):", phases, "cpu_ms_by_role")
    _by_role(
        f"cores busy during the throughput phase ({opts.threads} clients) by process (medians):",
        phases,
        "cores_by_role",
    )
    print("Redis commands per call by command (last round):")
    for name in names:
        counts = phases[name][-1].commands
        top = sorted(counts.items(), key=lambda kv: -kv[1])
        calls = opts.latency_calls
        detail = ", ".join(f"{k} {n / calls:.2f}" for k, n in top if n / calls >= 0.05)
        print(f"  {name:<8} {detail}")


def _by_role(title: str, phases: dict[str, list[Phase]], figure: str) -> None:
    print(title)
    for name, runs in phases.items():
        roles = getattr(runs[0], figure)
        medians = {role: statistics.median(getattr(p, figure).get(role, 0.0) for p in runs) for role in roles}
        detail = ", ".join(f"{role} {value:.2f}" for role, value in medians.items())
        print(f"  {name:<8} {detail} (total {sum(medians.values()):.2f})")


if __name__ == "__main__":
    raise SystemExit(main())
