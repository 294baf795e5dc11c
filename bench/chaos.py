"""Chaos soak (``python -m bench.chaos --minutes M``): the backbone's promise under everything at once.

Many agent sessions (threads, one ``ToolGateway`` each) send batches of calls with random
hangs, crashes and errors to real prefork workers on a private redis-server with AOF on.
Meanwhile worker hosts are SIGKILLed (and replaced), Redis restarts on the same port and
data directory, and gateway processes are killed mid-call and replaced by a fresh gateway's
``collect``. At the end it prints calls, results, missing, duplicates, worst answer latency
against the deadline and stuck sessions; the exit status is 1 when an invariant fails:

* missing == 0: every accepted call got a result;
* duplicates == 0: no call was delivered twice, and what was delivered is what the ledger holds;
* worst batch return <= latest deadline of the batch + grace;
* stuck sessions == 0: no call of any run is left without a result in the ledger.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.chaos_failover import (
    CLUSTER_NODE_TIMEOUT_MS,
    Episode,
    FaultThread,
    History,
    cluster_allowance_ms,
    cluster_episode,
    duplicate_executions,
    episode_times,
    first_answers_ms,
    sentinel_allowance_ms,
    sentinel_episode,
    sentinel_kinds,
)
from bench.chaos_faults import (
    RECONNECT_MS,
    SweepPulse,
    Unattended,
    hog_every_slot,
    kill_everything,
    unattended_failures,
    unexpected_task_errors,
)
from tests.harness import (
    LocalCluster,
    Proc,
    base_env,
    kill_pids,
    register_cluster,
    settings_of,
    start_beat,
    start_watchdog,
    start_worker,
    wait_until,
)
from tests.misbehaving_tools import EXECUTIONS_FILE_ENV
from tests.sentinel_harness import LocalSentinels
from workers import ToolCall, ToolGateway, ToolResult
from workers.errors import LoopDetected
from workers.local.embedded_redis import EmbeddedRedis, free_port
from workers.settings import Settings
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger
from workers.store.records import CallField, Row

CallKey = tuple[str, str, str]  # session, run, call id
FAULT_SETS = ("mixed", "failover", "cluster-failover")
_WORKER_STARTS = 5

_GATEWAY_SCRIPT = """
import json, sys
from workers import ToolCall, ToolGateway
calls = [ToolCall(**c) for c in json.loads(sys.argv[2])]
print("submitting", flush=True)
ToolGateway().call_tools(session_key=sys.argv[1], run_id="r1", calls=calls)
print("returned", flush=True)
"""


@dataclass(frozen=True)
class Options:
    """Size and length of the run."""

    minutes: float
    sessions: int
    workers: int
    concurrency: int
    seed: int
    progress_s: float
    faults: str = "mixed"


def _parse(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="how long faults are injected")
    parser.add_argument("--sessions", type=int, default=10, help="concurrent agent sessions")
    parser.add_argument("--workers", type=int, default=2, help="worker hosts")
    parser.add_argument("--concurrency", type=int, default=3, help="pool processes per worker")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--progress-s", type=float, default=10.0, help="seconds between progress lines")
    parser.add_argument(
        "--faults",
        choices=FAULT_SETS,
        default="mixed",
        help="mixed: one redis-server; failover: Sentinels; cluster-failover: Redis Cluster with replicas",
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    return Options(
        args.minutes, args.sessions, args.workers, args.concurrency, seed, args.progress_s, args.faults
    )


@dataclass
class Tally:
    """Everything submitted and delivered, shared by all threads (guarded by ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    submitted: list[CallKey] = field(default_factory=list)
    delivered: dict[CallKey, list[ToolResult]] = field(default_factory=dict)
    batches: list[tuple[list[CallKey], int]] = field(default_factory=list)  # calls, returned at (ms)
    events: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    history: History | None = None  # the failover legs' files outside Redis

    def submit(self, keys: list[CallKey]) -> None:
        with self.lock:
            self.submitted.extend(keys)

    def deliver(
        self, session: str, run: str, results: list[ToolResult], *, batch: bool = True, submitted_ms: int = 0
    ) -> None:
        if self.history is not None:
            self.history.handed(session, run, submitted_ms, results)
        now = int(time.time() * 1000)
        keys = [(session, run, r.tool_call_id) for r in results]
        with self.lock:
            for key, result in zip(keys, results, strict=True):
                self.delivered.setdefault(key, []).append(result)
            if batch:
                self.batches.append((keys, now))

    def deliver_calls(self, session: str, run: str, calls: list[ToolCall], results: list[ToolResult]) -> None:
        self.deliver(session, run, results)

    def note(self, event: str, error: str | None = None) -> None:
        with self.lock:
            self.events[event] += 1
            if error:
                self.errors.append(error)


def _random_call(rng: random.Random, call_id: str) -> ToolCall:
    roll = rng.random()
    secs = round(rng.uniform(0.1, 2.5), 2)
    table: list[tuple[float, str, dict[str, object]]] = [
        (0.35, "echo", {"text": call_id}),
        (0.50, "sleepy", {"seconds": secs}),  # soft limit 1 s: about half of them hang past it
        (0.54, "stubborn", {"seconds": 5.0 + secs}),  # only the hard limit stops it
        (0.60, "crash", {"how": rng.choice(["sigkill", "segv", "exit"])}),
        (0.70, "boom", {"message": f"broken {call_id}"}),
        (0.80, "slow_idempotent", {"seconds": secs}),
        (0.92, "slow", {"seconds": secs}),
        (1.00, "flaky", {"key": call_id, "failures": rng.randint(0, 2)}),
    ]
    name, arguments = next((n, a) for limit, n, a in table if roll < limit)
    return ToolCall(id=call_id, name=name, arguments=arguments)


def _agent_loop(settings: Settings, index: int, seed: int, tally: Tally, stop: threading.Event) -> None:
    """One agent session: batches of 1-4 calls until ``stop``; a loop abort starts a new run."""
    rng = random.Random(seed * 1000 + index)
    session, run, count = f"chaos-{index}", 0, 0
    gateway = ToolGateway(settings)
    try:
        while not stop.is_set():
            calls = [_random_call(rng, f"c{count + i}") for i in range(rng.randint(1, 4))]
            count += len(calls)
            run_id = f"r{run}"
            tally.submit([(session, run_id, c.id) for c in calls])
            submitted_ms = int(time.time() * 1000)
            try:
                results = gateway.call_tools(session_key=session, run_id=run_id, calls=calls)
            except LoopDetected as exc:
                results, run = list(exc.results), run + 1
                tally.note("loop aborts")
            tally.deliver(session, run_id, results, submitted_ms=submitted_ms)
    except Exception as exc:  # noqa: BLE001 - an unanswered batch is what this bench reports
        tally.note("session errors", f"{session}: {type(exc).__name__}: {exc}")
    finally:
        gateway.close()


@dataclass
class Cluster:
    """Redis, workers and beat of the run, and every pid to kill at the end."""

    server: EmbeddedRedis | None  # the mixed soak's one redis-server (None on the failover legs)
    env: dict[str, str]
    concurrency: int
    closers: list[Callable[[], None]] = field(default_factory=list)  # the failover legs' topologies
    workers: list[Proc] = field(default_factory=list)
    others: list[Proc] = field(default_factory=list)
    strays: list[int] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)  # of every worker and watchdog, killed ones too
    started: int = 0
    refused_starts: int = 0  # a worker started while no primary is named exits 2; restarted

    def add_worker(self) -> Proc:
        for attempt in range(_WORKER_STARTS):
            self.started += 1
            name = f"chaos{os.getpid()}-{self.started}"
            try:
                proc = start_worker(self.env, concurrency=self.concurrency, name=name)
            except AssertionError:
                # As a supervisor would: a worker refuses to start while Redis cannot be reached
                # (a failover under way names no primary for a second or two); start it again.
                if attempt == _WORKER_STARTS - 1:
                    raise
                self.refused_starts += 1
                time.sleep(1.0)  # the supervisor's restart delay, not a condition to await
                continue
            self.workers.append(proc)
            self.logs.append(proc.log_path)
            return proc
        raise AssertionError("unreachable")

    def kill_worker(self, rng: random.Random) -> str:
        """SIGKILL one worker's main process (and, half the time, its pool: the host died)."""
        victim = rng.choice(self.workers)
        self.workers.remove(victim)
        orphans = victim.children()
        self.strays.extend(orphans)
        victim.kill_hard()
        whole_host = rng.random() < 0.5
        if whole_host:
            kill_pids(orphans)
        victim.stop(timeout_s=1)
        self.add_worker()
        return "host" if whole_host else "main process"

    def restart_redis(self, outage_s: float) -> tuple[int, int]:
        """Stop Redis for ``outage_s`` and start it again; returns when it was gone (ms)."""
        assert self.server is not None, "only the mixed soak restarts its one redis-server"
        began_ms = int(time.time() * 1000)
        self.server.stop()
        time.sleep(outage_s)  # the outage itself is the fault being injected
        self.server.start()
        return began_ms, int(time.time() * 1000)

    def kill_all_workers(self, ledger: Ledger, n: int) -> list[Unattended]:
        """Every worker host and some unattended agent processes die at once; workers come back later."""
        unattended, strays = kill_everything(self.env, ledger, self.workers, n)
        self.strays.extend(strays)
        count = len(self.workers)
        self.workers.clear()
        # Long enough for every lease to lapse: only the watchdog can answer what they held.
        time.sleep(4.0)  # the outage of every worker is the fault being injected
        for _ in range(count):
            self.add_worker()
        return unattended

    def close(self) -> None:
        procs = self.workers + self.others
        for proc in procs:
            self.strays.extend(proc.children())
        stoppers = [threading.Thread(target=proc.stop, kwargs={"timeout_s": 5}) for proc in procs]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join()
        kill_pids(self.strays)
        if self.server is not None:
            self.server.close()
        for close in self.closers:
            close()


def _gateway_restart(cluster: Cluster, settings: Settings, rng: random.Random, n: int, tally: Tally) -> None:
    """A gateway process dies mid-call; a fresh gateway collects the run."""
    session = f"chaos-gw-{n}"
    calls = [_random_call(rng, f"g{i}") for i in range(rng.randint(2, 4))]
    calls[0] = ToolCall(id="g0", name="slow", arguments={"seconds": round(rng.uniform(1, 3), 2)})
    payload = json.dumps([c.model_dump(mode="json") for c in calls])
    submitted_ms = int(time.time() * 1000)
    proc = Proc([sys.executable, "-c", _GATEWAY_SCRIPT, session, payload], cluster.env, f"chaos-gw{n}")
    try:
        fresh = ToolGateway(settings)
    except Exception as exc:  # noqa: BLE001 - a gateway that cannot start is an invariant failure
        proc.stop(timeout_s=1)
        tally.note(
            "collect errors", f"{session}: a fresh gateway could not start: {type(exc).__name__}: {exc}"
        )
        return
    ledger = fresh._rt.ledger
    keys = ledger.keys(session, "r1")
    try:
        with contextlib.suppress(AssertionError):
            wait_until(lambda: _registered(ledger, keys) >= len(calls), timeout_s=20, what="calls registered")
        accepted = set(_safe_call_ids(ledger, keys))
        proc.kill_hard()
        proc.stop(timeout_s=1)
        tally.submit([(session, "r1", c.id) for c in calls if c.id in accepted])
        if len(accepted) < len(calls):
            tally.note("calls never registered by a killed gateway (not counted)")
        results = fresh.collect(session, "r1")
        tally.deliver(session, "r1", results, submitted_ms=submitted_ms)
        tally.note("gateway restarts")
    except Exception as exc:  # noqa: BLE001 - reported as an invariant failure
        tally.note("collect errors", f"{session}: {type(exc).__name__}: {exc}")
    finally:
        fresh.close()


def _safe_call_ids(ledger: Ledger, keys: RunKeys) -> list[str]:
    try:
        return ledger.run_call_ids(keys)
    except Exception:  # noqa: BLE001 - Redis may be restarting right now
        return []


def _registered(ledger: Ledger, keys: RunKeys) -> int:
    return len(_safe_call_ids(ledger, keys))


@dataclass
class Report:
    """The figures printed at the end."""

    calls: int = 0
    results: int = 0
    missing: int = 0
    duplicates: int = 0
    differs: int = 0
    late: int = 0
    republished: int = 0  # messages published again, unclaimed after a lease (lost or queued)
    stuck_sessions: int = 0
    worst_batch_ms: int = -(10**9)
    worst_call_ms: int = -(10**9)
    worst_call: str = ""  # the call of ``worst_call_ms`` and who wrote its answer
    wrong: list[CallKey] = field(default_factory=list)  # delivered != ledger, or absent from it
    reasons: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    worst_sweep_gap_ms: int = 0
    worst_sweep_gap_at: str = ""
    sweep_gap_limit_ms: int = 0
    sweeps: int = 0
    unattended: int = 0
    watch_failures: list[str] = field(default_factory=list)
    absent: int = 0  # delivered, yet the ledger holds no such call
    executions: int = 0  # from the executions file (failover legs)
    duplicate_executions: int = 0
    idempotent_reruns: int = 0  # an idempotent tool run again under a new attempt: by design
    duplicate_examples: list[str] = field(default_factory=list)
    unexpected: Counter[str] = field(default_factory=Counter)  # task errors no task should raise

    def failures(self, grace_ms: int, errors: list[str]) -> list[str]:
        gap_ok = self.worst_sweep_gap_ms <= self.sweep_gap_limit_ms
        checks = [
            (self.worst_call_ms <= grace_ms, f"worst ledger write {self.worst_call_ms} ms past deadline"),
            (
                gap_ok,
                f"worst gap between sweeps {self.worst_sweep_gap_ms} ms > {self.sweep_gap_limit_ms} ms "
                f"({self.worst_sweep_gap_at})",
            ),
            (not self.watch_failures, f"watchdog: {self.watch_failures[:5]}"),
            (self.missing == 0, f"missing {self.missing}"),
            (self.duplicates == 0, f"duplicates {self.duplicates}"),
            (self.differs == 0, f"delivered results differing from the ledger {self.differs}"),
            (self.absent == 0, f"delivered results of calls the ledger does not hold {self.absent}"),
            (
                self.duplicate_executions * 100 <= self.calls,
                f"duplicate executions {self.duplicate_executions} > 1% of {self.calls} calls",
            ),
            (self.stuck_sessions == 0, f"stuck sessions {self.stuck_sessions}"),
            (not self.unexpected, f"tasks raised unexpected errors {dict(self.unexpected)}"),
            (self.worst_batch_ms <= grace_ms, f"worst return {self.worst_batch_ms} ms past deadline"),
            (not errors, f"errors: {errors[:5]}"),
        ]
        return [text for ok, text in checks if not ok]


def _record_state(ledger: Ledger, key: CallKey) -> str:
    """Whether the call's record exists although its run's call index does not list it."""
    record = ledger.record(ledger.keys(key[0], key[1]), key[2])
    return "no record" if record is None else f"record {record.state.value}, not in the run's index"


def _note_ledger_write(report: Report, key: CallKey, row: Row[CallField]) -> None:
    """Keep the latest ledger write against its deadline (a registered call's record)."""
    if CallField.FINISHED_MS not in row:
        return
    past_ms = row.integer(CallField.FINISHED_MS) - row.integer(CallField.DEADLINE_MS)
    if past_ms > report.worst_call_ms:
        report.worst_call_ms = past_ms
        tool, writer = row.raw(CallField.TOOL), row.raw(CallField.WRITER)
        report.worst_call = f"{'/'.join(key)} ({tool}) written by {writer}"


def _audit(tally: Tally, ledger: Ledger) -> Report:
    report = Report(calls=len(set(tally.submitted)))
    report.results = sum(len(v) for v in tally.delivered.values())
    report.missing = len(set(tally.submitted) - set(tally.delivered))
    report.duplicates = sum(1 for v in tally.delivered.values() if len(v) > 1)
    runs = sorted({(s, r) for s, r, _ in tally.submitted})
    deadlines: dict[CallKey, int] = {}
    held: set[CallKey] = set()
    for session, run in runs:
        keys = ledger.keys(session, run)
        call_ids = ledger.run_call_ids(keys)
        held.update((session, run, c) for c in call_ids)
        if ledger.open_calls(keys, call_ids):
            report.stuck_sessions += 1
        stored = ledger.results(keys, call_ids)
        for call_id in call_ids:
            key = (session, run, call_id)
            record = ledger.record(keys, call_id)
            if record is None:
                continue
            if CallField.DEADLINE_MS in record.row:  # absent: answered, never registered
                deadlines[key] = record.row.integer(CallField.DEADLINE_MS)
                _note_ledger_write(report, key, record.row)
            report.late += len(ledger.late_results(keys, call_id))
            report.republished += record.row.integer(CallField.REPUBLISHES)
            delivered = tally.delivered.get(key, [])
            for result in delivered:
                if stored.get(call_id) != result:
                    report.differs += 1
                    report.wrong.append(key)
                    report.examples.append(_difference(key, result, stored.get(call_id), record.row))
            for result in delivered[:1]:
                report.reasons[result.reason or "real result"] += 1
    report.absent = sum(1 for key in tally.delivered if key not in held)
    report.wrong.extend(key for key in tally.delivered if key not in held)
    report.examples.extend(
        f"{'/'.join(k)}: delivered, not in the ledger ({_record_state(ledger, k)})"
        for k in tally.delivered
        if k not in held
    )
    for keys_of_batch, returned_ms in tally.batches:
        latest = max((deadlines.get(k, 0) for k in keys_of_batch), default=0)
        if latest:
            report.worst_batch_ms = max(report.worst_batch_ms, returned_ms - latest)
    return report


def _difference(
    key: CallKey, delivered: ToolResult, stored: ToolResult | None, fields: Row[CallField]
) -> str:
    def show(result: ToolResult | None) -> str:
        return "nothing" if result is None else f"{result.reason or 'real'} {result.text[:90]!r}"

    return (
        f"{'/'.join(key)} ({fields.raw(CallField.TOOL)}): delivered {show(delivered)}; "
        f"ledger holds {show(stored)} written by {fields.raw(CallField.WRITER)}"
    )


def _schedule(duration_s: float, rng: random.Random) -> list[tuple[float, str]]:
    kill_every = max(5.0, min(25.0, duration_s / 4))
    gateway_every = max(6.0, min(20.0, duration_s / 3))
    plan = [(t, "kill worker") for t in _times(kill_every * 0.5, duration_s, kill_every, rng)]
    plan += [(t, "gateway restart") for t in _times(gateway_every * 0.7, duration_s, gateway_every, rng)]
    plan += [(t, "redis restart") for t in _times(duration_s * 0.4, duration_s, 150.0, rng)]
    plan += [(duration_s * 0.15, "hog every slot"), (duration_s * 0.75, "kill everything")]
    return sorted(plan)


def _times(first: float, end: float, every: float, rng: random.Random) -> list[float]:
    times, t = [], first
    while t < end * 0.9:
        times.append(t + rng.uniform(-0.1, 0.1) * every)
        t += every
    return times


def _progress(tally: Tally, started: float) -> str:
    with tally.lock:
        calls, answered = len(tally.submitted), len(tally.delivered)
        events = ", ".join(f"{k} {v}" for k, v in sorted(tally.events.items()))
    elapsed = time.monotonic() - started
    return f"[{elapsed:6.1f}s] calls {calls}, answered {answered} | {events or 'no faults yet'}"


@dataclass
class Watch:
    """What the soak keeps an eye on besides the calls: the watchdog's pulse, unattended runs."""

    pulse: SweepPulse
    ledger: Ledger
    unattended: list[Unattended] = field(default_factory=list)
    hogs: list[threading.Thread] = field(default_factory=list)
    failover_plan: list[tuple[float, Callable[[], Episode]]] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    allowance_ms: int = 0  # the failover allowance (0 on the mixed soak)


def _inject(
    options: Options, cluster: Cluster, settings: Settings, tally: Tally, rng: random.Random, watch: Watch
) -> None:
    """Run the fault schedule for the run's duration, printing progress."""
    duration_s = options.minutes * 60
    plan = _schedule(duration_s, rng)
    if watch.failover_plan:  # the topology's own episodes replace the one server's restarts
        plan = [(t, action) for t, action in plan if action != "redis restart"]

    def on_episode(episode: Episode) -> None:
        watch.episodes.append(episode)
        if episode.stalls_writes:
            watch.pulse.outage(episode.began_ms, episode.ended_ms)
        tally.note(f"failover episodes ({episode.kind})")

    faults = FaultThread(watch.failover_plan, on_episode, lambda e: tally.note("failover errors", e)).start()
    started = next_progress = time.monotonic()
    helpers: list[threading.Thread] = []
    while (now := time.monotonic() - started) < duration_s:
        if plan and plan[0][0] <= now:
            _, action = plan.pop(0)
            if action == "kill worker":
                tally.note(f"worker kills ({cluster.kill_worker(rng)})")
            elif action == "redis restart":
                watch.pulse.outage(*cluster.restart_redis(rng.uniform(0.5, 1.5)))
                tally.note("redis restarts")
            elif action == "hog every slot":
                slots, hold_s = len(cluster.workers) * cluster.concurrency, min(120.0, duration_s * 0.4)
                watch.hogs.append(hog_every_slot(settings, slots, hold_s, tally.deliver_calls))
                tally.submit([("chaos-hog", "r1", f"h{i}") for i in range(slots)])
                tally.note("slots hogged")
            elif action == "kill everything":
                watch.unattended += cluster.kill_all_workers(watch.ledger, tally.events["kill everything"])
                tally.note("kill everything")
            else:
                n = tally.events["gateway restarts"] + len(helpers)
                args = (cluster, settings, random.Random(rng.random()), n, tally)
                helpers.append(threading.Thread(target=_gateway_restart, args=args, daemon=True))
                helpers[-1].start()
        if time.monotonic() >= next_progress:
            print(_progress(tally, started), flush=True)
            next_progress += options.progress_s
        time.sleep(0.05)
    faults.stop(timeout_s=120)
    for helper in helpers:
        helper.join(90)


@dataclass
class Stores:
    """The Redis a run's processes use, and what the failover legs inject into it."""

    server: EmbeddedRedis | None
    env: dict[str, str]
    closers: list[Callable[[], None]]
    plan: list[tuple[float, Callable[[], Episode]]]
    describe: str


def _stores(options: Options, data_dir: str, history: History) -> Stores:
    """Start the run's Redis: one redis-server, a Sentinel topology, or a Redis Cluster with replicas."""
    extra = {"UNSTUCK_WATCHDOG__INTERVAL_S": "1", EXECUTIONS_FILE_ENV: str(history.executions_path)}
    times = episode_times(options.minutes * 60)
    faults_rng = random.Random(options.seed + 1)  # episodes draw apart from the main plan
    if options.faults == "failover":
        topology = LocalSentinels(appendonly=True).start()
        env = base_env(topology.url, UNSTUCK_REDIS__SENTINEL_MASTER=topology.master, **extra)
        kinds = sentinel_kinds(len(times), faults_rng)
        plan: list[tuple[float, Callable[[], Episode]]] = [
            (t, functools.partial(sentinel_episode, topology, kind, random.Random(faults_rng.random())))
            for t, kind in zip(times, kinds, strict=True)
        ]
        ports = "/".join(str(n.port) for n in topology.nodes)
        return Stores(None, env, [topology.close], plan, f"sentinel {topology.url} (nodes {ports})")
    if options.faults == "cluster-failover":
        nodes = LocalCluster(3, replicas=1, node_timeout_ms=CLUSTER_NODE_TIMEOUT_MS, appendonly=True).start()
        broker = EmbeddedRedis().start()
        register_cluster(nodes.url, broker.url)
        env = base_env(nodes.url, **extra)
        # A killed primary and a stopped one in turn (a stopped one may take writes for a
        # moment after its replica is promoted).
        kinds = ["primary SIGKILL", "primary SIGSTOP"]
        kills: list[tuple[float, Callable[[], Episode]]] = [
            (t, functools.partial(cluster_episode, nodes, random.Random(faults_rng.random()), kinds[n % 2]))
            for n, t in enumerate(times)
        ]
        return Stores(
            None, env, [nodes.close, broker.close], kills, f"cluster {nodes.url}, broker {broker.url}"
        )
    server = EmbeddedRedis(port=free_port(), appendonly=True, data_dir=data_dir).start()
    return Stores(server, base_env(server.url, **extra), [], [], f"redis {server.url}")


def run(options: Options) -> int:
    """The whole soak; returns the exit status."""
    # Store outages are part of the plan: the gateway's warnings about them would drown the report.
    logging.basicConfig(level=logging.ERROR, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    rng, began = random.Random(options.seed), time.monotonic()
    data_dir = tempfile.mkdtemp(prefix="unstuck-chaos-")
    history = History(Path(data_dir))
    stores = _stores(options, data_dir, history)
    cluster = Cluster(stores.server, stores.env, options.concurrency, closers=stores.closers)
    print(
        f"chaos: seed {options.seed} (SEED={options.seed} replays it), faults {options.faults}, "
        f"{options.minutes} min, {options.sessions} sessions, {stores.describe}",
        flush=True,
    )
    try:
        settings = settings_of(cluster.env)
        allowance_ms = _allowance_ms(options.faults, settings)
        for _ in range(options.workers):
            cluster.add_worker()
        cluster.others.append(start_watchdog(cluster.env))
        cluster.logs.append(cluster.others[-1].log_path)
        cluster.others.append(start_beat(cluster.env))
        tally, stop = Tally(history=history), threading.Event()
        agents = [
            threading.Thread(
                target=_agent_loop,
                args=(settings, i, options.seed, tally, stop),
                name=f"chaos-{i}",
                daemon=True,
            )
            for i in range(options.sessions)
        ]
        for agent in agents:
            agent.start()
        print(f"chaos: cluster up in {time.monotonic() - began:.1f}s; injecting faults", flush=True)
        watcher = ToolGateway(settings)  # its ledger reads the pulse and the unattended runs
        watch = Watch(SweepPulse(watcher._rt.ledger).start(), watcher._rt.ledger)
        watch.failover_plan, watch.allowance_ms = stores.plan, allowance_ms
        _inject(options, cluster, settings, tally, rng, watch)
        stop.set()
        drain_started = time.monotonic()
        _drain(
            [*agents, *watch.hogs],
            options.progress_s,
            limit_s=120.0,
            show=_open_calls_of(tally, watch.ledger),
        )
        print(f"chaos: sessions drained in {time.monotonic() - drain_started:.1f}s", flush=True)
        if any(agent.is_alive() for agent in agents):
            tally.note("session errors", "a session was still waiting 120 s after the end")
        watch.pulse.stop()
        if cluster.refused_starts:
            tally.events["worker starts refused (no primary yet)"] = cluster.refused_starts
        _from_history(tally, history)
        auditor = ToolGateway(settings)
        try:
            report = _audit(tally, auditor._rt.ledger)
            _audit_watchdog(report, watch, settings)
        finally:
            auditor.close()
        report.unexpected = unexpected_task_errors(path.read_text(errors="replace") for path in cluster.logs)
        executions = history.executions()
        report.executions = len(executions)
        report.duplicate_executions, report.idempotent_reruns, report.duplicate_examples = (
            duplicate_executions(executions)
        )
        limit_ms = int(settings.gateway.grace_s * 1000) + allowance_ms
        status = _print_report(report, tally, limit_ms)
        status = _print_figures(options, report, watch, history, limit_ms, status)
        if status and options.faults != "mixed":
            keep = tempfile.mkdtemp(prefix="unstuck-chaos-history-")
            for path in (history.handed_path, history.executions_path):
                if path.exists():
                    shutil.copy(path, keep)
            print(f"chaos: history kept in {keep} (handed.jsonl, executions.jsonl)", flush=True)
        return status
    finally:
        cluster.close()
        shutil.rmtree(data_dir, ignore_errors=True)


def _allowance_ms(faults: str, settings: Settings) -> int:
    if faults == "failover":
        return sentinel_allowance_ms(settings)
    if faults == "cluster-failover":
        return cluster_allowance_ms(settings)
    return 0


def _from_history(tally: Tally, history: History) -> None:
    """The checker judges what the agents' file says they were handed, not what memory holds."""
    delivered: dict[CallKey, list[ToolResult]] = {}
    batches: list[tuple[list[CallKey], int]] = []
    for batch in history.batches():
        keys = [(batch.session, batch.run, r.tool_call_id) for r in batch.results]
        for key, result in zip(keys, batch.results, strict=True):
            delivered.setdefault(key, []).append(result)
        batches.append((keys, batch.returned_ms))
    with tally.lock:
        tally.delivered, tally.batches = delivered, batches


def _print_figures(
    options: Options, report: Report, watch: Watch, history: History, limit_ms: int, status: int
) -> int:
    """The run's figures on one line (the failover legs add their episodes); the status unchanged."""
    firsts = first_answers_ms(watch.episodes, history.batches())
    for episode, first in zip((e for e in watch.episodes if e.hits_primary), firsts, strict=True):
        promoted = "-" if episode.promoted_ms is None else f"{episode.promoted_ms} ms"
        answered = "none" if first is None else f"{first} ms"
        print(
            f"  episode {episode.kind} ({episode.detail}): failover {'yes' if episode.failover else 'no'}, "
            f"promoted after {promoted}, first answered call {answered} after the fault",
            flush=True,
        )
    for example in report.duplicate_examples[:10]:
        print(f"  duplicate: {example}", flush=True)
    near = _near_episodes(report.wrong, watch.episodes, history)
    for line in near[:12]:
        print(f"  wrong: {line}", flush=True)
    if near:
        kinds = Counter(line.split("(", 1)[-1].split(",", 1)[0] for line in near if "episode" in line)
        print(f"  wrong calls by nearest episode: {dict(sorted(kinds.items()))}", flush=True)
    known = [f for f in firsts if f is not None]
    worst_first = f"{max(known)} ms" if known else "-"
    print(
        f"chaos figures: seed {options.seed}, faults {options.faults}, calls {report.calls}, "
        f"failovers {sum(1 for e in watch.episodes if e.failover)} of {len(watch.episodes)} episodes, "
        f"kill to first answered call worst {worst_first}, executions {report.executions}, "
        f"duplicate executions {report.duplicate_executions}, "
        f"idempotent re-runs {report.idempotent_reruns}, "
        f"worst lateness {report.worst_batch_ms:+d} ms (limit {limit_ms} ms: grace + allowance "
        f"{watch.allowance_ms} ms)",
        flush=True,
    )
    if status == 0:
        print(f"chaos: PASS seed {options.seed} faults {options.faults}", flush=True)
    return status


def _near_episodes(keys: list[CallKey], episodes: list[Episode], history: History) -> list[str]:
    """When each wrongly kept call was handed, against the failover episode nearest to it."""
    handed = {(b.session, b.run, r.tool_call_id): b.returned_ms for b in history.batches() for r in b.results}
    lines = []
    for key in keys:
        at_ms = handed.get(key)
        if at_ms is None or not episodes:
            lines.append(f"{'/'.join(key)}: no episode to compare with")
            continue
        index, near = min(enumerate(episodes), key=lambda pair: abs(at_ms - pair[1].began_ms))
        lines.append(
            f"{'/'.join(key)} handed {at_ms - near.began_ms:+d} ms from episode {index + 1} "
            f"({near.kind}, {near.detail or 'no detail'})"
        )
    return lines


def _open_calls_of(tally: Tally, ledger: Ledger) -> Callable[[str], str]:
    """What the ledger says about a session's unanswered calls (its latest run)."""

    def show(session: str) -> str:
        with tally.lock:
            runs = [r for s, r, _ in tally.submitted if s == session]
        if not runs:
            return "no calls submitted"
        keys = ledger.keys(session, runs[-1])
        try:
            open_calls = ledger.open_calls(keys, ledger.run_call_ids(keys))
        except Exception as exc:  # noqa: BLE001 - a diagnostic must not end the soak
            return f"ledger unreadable: {exc}"
        now_ms = int(time.time() * 1000)
        return (
            "; ".join(
                f"{c.call_id} {c.tool} {c.state} attempt {c.attempt} "
                f"lease {'alive' if c.lease_alive else 'gone'} "
                f"deadline in {c.deadline_ms - now_ms} ms"
                for c in open_calls
            )
            or "ledger: every call answered"
        )

    return show


def _drain(
    threads: list[threading.Thread], progress_s: float, limit_s: float, show: Callable[[str], str]
) -> None:
    """Wait for the sessions to finish; name the ones still waiting, and show where they wait."""
    started, stacks_shown = time.monotonic(), False
    while (alive := [t for t in threads if t.is_alive()]) and time.monotonic() - started < limit_s:
        alive[0].join(progress_s)
        waited = time.monotonic() - started
        if still := [t.name for t in threads if t.is_alive()]:
            print(f"[drain {waited:5.1f}s] still waiting: {', '.join(still)}", flush=True)
        if still and not stacks_shown and waited >= 3 * progress_s:
            _print_stacks([t for t in threads if t.is_alive()], show)
            stacks_shown = True


def _print_stacks(threads: list[threading.Thread], show: Callable[[str], str]) -> None:
    frames = sys._current_frames()  # the only way to see where a live thread waits
    for thread in threads:
        frame = frames.get(thread.ident or -1)
        if frame is not None:
            where = "".join(traceback.format_stack(frame)[-12:])
            print(f"--- {thread.name} waits in:\n{where}", flush=True)
            print(f"--- {thread.name}: {show(thread.name)}", flush=True)


def _audit_watchdog(report: Report, watch: Watch, settings: Settings) -> None:
    interval_ms = int(settings.watchdog.interval_s * 1000)
    report.sweeps = len(watch.pulse.sweeps_ms) + watch.pulse.missed  # the watchdog's count
    report.worst_sweep_gap_ms, report.worst_sweep_gap_at = watch.pulse.worst_gap(reconnect_ms=RECONNECT_MS)
    report.sweep_gap_limit_ms = interval_ms + 1000
    budget_ms = int(settings.lease.ttl_s * 1000) + interval_ms + 2000 + watch.allowance_ms
    report.unattended = sum(1 for run in watch.unattended if run.was_running)
    report.watch_failures = unattended_failures(
        watch.ledger, watch.unattended, budget_ms, watch.pulse.sweeps_ms
    )


def _print_report(report: Report, tally: Tally, grace_ms: int) -> int:
    print(
        f"calls {report.calls}, results {report.results}, missing {report.missing}, "
        f"duplicates {report.duplicates}, differing from ledger {report.differs}, "
        f"late (audit only) {report.late}, messages republished {report.republished}\n"
        f"worst answer vs deadline: batch return {report.worst_batch_ms:+d} ms, ledger write "
        f"{report.worst_call_ms:+d} ms (limit {grace_ms} ms; {report.worst_call or 'none'})\n"
        f"stuck sessions {report.stuck_sessions}, tasks that raised unexpected errors "
        f"{sum(report.unexpected.values())}\n"
        f"watchdog: {report.sweeps} sweeps, worst gap {report.worst_sweep_gap_ms} ms (counted from "
        f"{RECONNECT_MS // 1000} s after "
        f"any Redis outage; limit {report.sweep_gap_limit_ms} ms); unattended runs answered by it "
        f"alone: {report.unattended}\n"
        f"faults: {dict(sorted(tally.events.items()))}\n"
        f"outcomes: {dict(sorted(report.reasons.items()))}",
        flush=True,
    )
    for example in report.examples[:10]:
        print(f"  differs: {example}", flush=True)
    failures = report.failures(grace_ms, tally.errors)
    for failure in failures:
        print(f"INVARIANT FAILED: {failure}", flush=True)
    if failures:
        print("chaos: FAIL", flush=True)
    return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m bench.chaos``."""
    return run(_parse(argv))


if __name__ == "__main__":
    sys.exit(main())
