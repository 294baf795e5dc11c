"""Two failovers in a row (issue 42): ``python -m bench.failover_sequence``.

A Sentinel topology on loopback (a primary, ``--replicas`` replicas, three Sentinels), one
worker, the watchdog and beat, all with default settings but the Sentinel list, and six agents
calling a tool that appends each execution to a file outside Redis
(tests/misbehaving_tools.py). The faults, in seconds from the start of the load:

1. the primary is SIGKILLed at ``--kill-at`` (10);
2. the old primary is restarted at ``--restart-at`` (25): it rejoins as a replica;
3. the primary the Sentinels name then (the promoted one) is SIGSTOPped at ``--stop-at`` (35)
   for ``--stop-s`` (6).

With one replica the old primary may be promoted again before it has copied what the promoted
one took meanwhile: "a returning primary failed over again before it resyncs".

The agents talk through the Python gateway (``--door python``) or ``unstuck serve``
(``--door http``). After the load, ``ToolGateway.collect`` reads back what the ledger holds for
every run an agent was handed, and the run reports, against the agents' own history:

* missing: an answer an agent was handed that the ledger does not hold;
* differing: a ledger answer that is not what the agent was handed;
* late: an answer handed later than its deadline + the gateway's grace + the failover allowance;
* duplicates: executions beyond one per call (the tool's own file), and their share of calls.

Each run picks a seed (``--seed`` replays one: the tools' arguments and the agents' pauses;
the faults land on real process timing, so a seed does not fix the interleaving) and prints
it. The exit status is 1 when missing, differing or late is not 0, or duplicates exceed 1%.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import logging
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.chaos_failover import duplicate_executions, sentinel_allowance_ms
from tests.harness import UNSTUCK, Proc, settings_of, start_beat, start_watchdog, start_worker, wait_until
from tests.misbehaving_tools import EXECUTIONS_FILE_ENV
from tests.sentinel_harness import LocalSentinels
from workers import ToolCall, ToolGateway, ToolResult
from workers.local.embedded_redis import EmbeddedRedis, free_port
from workers.settings import Settings
from workers.store.kept_answers import kept_counts
from workers.store.records import CallField

__all__ = ["Handed", "Options", "Outcome", "main", "run"]

_AGENTS = 6
_DUPLICATES_LIMIT = 0.01


@dataclass(frozen=True)
class Options:
    """One run: the topology, the door, the seed and the fault times (seconds into the load)."""

    replicas: int = 1
    door: str = "python"
    seed: int = 0
    kill_at: float = 10.0
    restart_at: float = 25.0
    stop_at: float = 35.0
    stop_s: float = 6.0
    load_s: float = 50.0


@dataclass(frozen=True)
class Handed:
    """What one agent was handed for one call (the driver's own history, outside Redis)."""

    session: str
    run: str
    call_id: str
    submitted_ms: int
    returned_ms: int
    result: ToolResult | None
    error: str = ""


@dataclass
class Outcome:
    """The figures of one run."""

    seed: int
    replicas: int
    door: str
    calls: int = 0
    missing: int = 0
    differing: int = 0
    late: int = 0
    unanswered: int = 0
    duplicates: int = 0
    reruns: int = 0
    first_ok_after_kill_ms: int | None = None
    worst_ms: int = 0
    limit_ms: int = 0
    examples: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    restored: int = 0
    conflicts: int = 0

    @property
    def passed(self) -> bool:
        allowed = int(self.calls * _DUPLICATES_LIMIT)
        return (self.missing, self.differing, self.late, self.unanswered) == (0, 0, 0, 0) and (
            self.duplicates <= allowed
        )

    def line(self) -> str:
        first = (
            "none" if self.first_ok_after_kill_ms is None else f"{self.first_ok_after_kill_ms / 1000:.1f} s"
        )
        share = 100.0 * self.duplicates / self.calls if self.calls else 0.0
        verdict = "PASS" if self.passed else "FAIL"
        return (
            f"failover-sequence: {verdict} seed {self.seed} replicas {self.replicas} door {self.door}:"
            f" calls {self.calls}, missing {self.missing}, differing {self.differing}, late {self.late},"
            f" unanswered {self.unanswered}, duplicates {self.duplicates} ({share:.2f}%, +{self.reruns}"
            f" idempotent re-runs), worst answer {self.worst_ms} ms (limit {self.limit_ms} ms),"
            f" first ok answer {first} after the kill, answers written back {self.restored}"
            f" (conflicts {self.conflicts}), {self.elapsed_s:.0f} s"
        )


def _parse(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.failover_sequence", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--door", choices=["python", "http"], default="python")
    parser.add_argument("--seed", type=int, default=None, help="default: a fresh one, printed")
    parser.add_argument("--load-s", type=float, default=50.0)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    return Options(replicas=args.replicas, door=args.door, seed=seed, load_s=args.load_s)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _call(rng: random.Random, call_id: str) -> ToolCall:
    """``echo`` (idempotent) appends each execution to the executions file: one deadline for all."""
    return ToolCall(
        id=call_id,
        name="echo",
        arguments={"text": f"{call_id}-{rng.randrange(10**6)}", "times": rng.randint(1, 3)},
    )


class _Door:
    """How an agent hands a call over: the Python gateway, or ``unstuck serve`` over HTTP."""

    def __init__(self, settings: Settings, http_port: int | None) -> None:
        self._gateway = ToolGateway(settings) if http_port is None else None
        self._conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=120) if http_port else None

    def call(self, session: str, run: str, call: ToolCall) -> ToolResult:
        if self._gateway is not None:
            [result] = self._gateway.call_tools(session_key=session, run_id=run, calls=[call])
            return result
        assert self._conn is not None
        body = {"format": "neutral", "message": {"calls": [call.model_dump(by_alias=True)]}}
        self._conn.request(
            "POST",
            f"/v1/sessions/{session}/runs/{run}/tool-calls",
            json.dumps(body),
            {"Content-Type": "application/json"},
        )
        response = self._conn.getresponse()
        answer = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {answer}")
        [raw] = answer["results"]
        return ToolResult.model_validate(raw)

    def close(self) -> None:
        if self._gateway is not None:
            self._gateway.close()
        if self._conn is not None:
            self._conn.close()


def _agent(
    doors: Callable[[], _Door],
    index: int,
    seed: int,
    stop: threading.Event,
    handed: list[Handed],
    lock: threading.Lock,
) -> None:
    rng = random.Random(seed * 100 + index)
    session = f"agent{index}"
    n, door = 0, doors()
    try:
        while not stop.is_set():
            run, call = f"r{n}", _call(rng, "c")
            submitted = _now_ms()
            try:
                result: ToolResult | None = door.call(session, run, call)
                error = ""
            except Exception as exc:  # noqa: BLE001 - anything escaping the door is an unanswered call
                result, error = None, f"{type(exc).__name__}: {exc}"
                door.close()
                door = doors()  # a fresh connection after a broken one
            with lock:
                handed.append(Handed(session, run, call.id, submitted, _now_ms(), result, error))
            n += 1
            time.sleep(rng.uniform(0, 0.05))
    finally:
        door.close()


def _stop(node: EmbeddedRedis, stopped: bool) -> None:
    assert node.process is not None
    os.kill(node.process.pid, signal.SIGSTOP if stopped else signal.SIGCONT)


def _faults(topology: LocalSentinels, options: Options, started: float, log: list[str]) -> None:
    """The three faults, at their times from ``started`` (monotonic)."""

    def at(offset: float) -> None:
        time.sleep(max(0.0, started + offset - time.monotonic()))

    at(options.kill_at)
    first = topology.current_primary()
    assert first is not None, "no primary named before the kill"
    assert first.process is not None
    os.kill(first.process.pid, signal.SIGKILL)
    first.process.wait(timeout=5)
    log.append(f"{time.monotonic() - started:5.1f} s primary {first.port} SIGKILLed")
    at(options.restart_at)
    first.stop()
    first.start(timeout_s=30)
    log.append(f"{time.monotonic() - started:5.1f} s old primary {first.port} restarted")
    at(options.stop_at)
    promoted = topology.current_primary()
    assert promoted is not None, "the Sentinels name no primary at the stop"
    assert promoted is not first, "the Sentinels name the old primary again"
    _stop(promoted, True)
    log.append(f"{time.monotonic() - started:5.1f} s promoted primary {promoted.port} SIGSTOPped")
    try:
        at(options.stop_at + options.stop_s)
    finally:
        _stop(promoted, False)
    log.append(f"{time.monotonic() - started:5.1f} s promoted primary {promoted.port} resumed")


def _audit(gateway: ToolGateway, handed: list[Handed], outcome: Outcome, kill_ms: int) -> None:
    """Read back every run through ``ToolGateway.collect`` and compare with what was handed."""
    outcome.calls = len(handed)
    for h in handed:
        if h.result is None:
            outcome.unanswered += 1
            outcome.examples.append(f"{h.session}/{h.run} unanswered: {h.error}")
            continue
        took = h.returned_ms - h.submitted_ms
        outcome.worst_ms = max(outcome.worst_ms, took)
        if took > outcome.limit_ms:
            outcome.late += 1
            outcome.examples.append(f"{h.session}/{h.run} late: {took} ms ({h.result.text[:60]!r})")
        if not h.result.is_error and h.submitted_ms >= kill_ms:
            first = h.returned_ms - kill_ms
            if outcome.first_ok_after_kill_ms is None or first < outcome.first_ok_after_kill_ms:
                outcome.first_ok_after_kill_ms = first
        kept = {r.tool_call_id: r for r in gateway.collect(h.session, h.run)}
        stored = kept.get(h.call_id)
        if stored is None:
            outcome.missing += 1
            outcome.examples.append(f"{h.session}/{h.run} missing: handed {h.result.text[:60]!r}")
        elif stored != h.result:
            outcome.differing += 1
            outcome.examples.append(
                f"{h.session}/{h.run} differing: handed {h.result.text[:60]!r}, ledger {stored.text[:60]!r}"
            )


def run(options: Options) -> Outcome:
    """One run of the sequence; its figures."""
    began = time.monotonic()
    outcome = Outcome(options.seed, options.replicas, options.door)
    work = Path(tempfile.mkdtemp(prefix="unstuck-failover-seq-"))
    executions = work / "executions.jsonl"
    topology = LocalSentinels(appendonly=True, replicas=options.replicas).start()
    procs: list[Proc] = []
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("UNSTUCK_")} | {
            "UNSTUCK_REDIS__URL": topology.url,
            "UNSTUCK_REDIS__SENTINEL_MASTER": topology.master,
            "UNSTUCK_TOOL_MODULES": "tests.misbehaving_tools",
            EXECUTIONS_FILE_ENV: str(executions),
            "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
            "PYTHONUNBUFFERED": "1",
        }
        settings = settings_of(env)
        procs.append(start_worker(env, concurrency=4, name="seq"))
        procs.append(start_watchdog(env, name="seq"))
        procs.append(start_beat(env))
        port: int | None = None
        if options.door == "http":
            port = free_port()
            serve = Proc([UNSTUCK, "serve", "--port", str(port)], env, "seq-serve")
            procs.append(serve)
            serve.wait_for_log("Uvicorn running on", timeout_s=60)
        handed: list[Handed] = []
        lock, stop = threading.Lock(), threading.Event()
        agents = [
            threading.Thread(
                target=_agent,
                args=(functools.partial(_Door, settings, port), i, options.seed, stop, handed, lock),
                daemon=True,
            )
            for i in range(_AGENTS)
        ]
        for agent in agents:
            agent.start()
        wait_until(lambda: len(handed) >= 12, timeout_s=60, what="calls answered before the faults")
        budget_ms = _budget_ms(settings, handed[0])
        outcome.limit_ms = budget_ms + int(settings.gateway.grace_s * 1000) + sentinel_allowance_ms(settings)
        started = time.monotonic()
        kill_ms = _now_ms() + int(options.kill_at * 1000)
        log: list[str] = []
        _faults(topology, options, started, log)
        time.sleep(max(0.0, started + options.load_s - time.monotonic()))
        stop.set()
        for agent in agents:
            agent.join(timeout=180)
        for line in log:
            print(f"  fault {line}", flush=True)
        wait_until(topology.settled, timeout_s=90, interval_s=0.2, what="topology settled after the faults")
        auditor = ToolGateway(settings)
        try:
            _audit(auditor, handed, outcome, kill_ms)
            counts = kept_counts(auditor._rt.ledger.client, settings.redis.key_prefix)
            outcome.restored, outcome.conflicts = counts.get("restored", 0), counts.get("conflict", 0)
        finally:
            auditor.close()
        dups, reruns, examples = duplicate_executions(_executions(executions))
        outcome.duplicates, outcome.reruns = dups, reruns
        outcome.examples.extend(examples)
    finally:
        for proc in reversed(procs):
            proc.kill()
        topology.close()
    outcome.elapsed_s = time.monotonic() - began
    return outcome


def _budget_ms(settings: Settings, first: Handed) -> int:
    """A call's deadline, ms after its submission, from the ledger record of the first call.

    Every call is an ``echo``, so every call has this budget (its hard timeout, the queue
    allowance and the hard grace, as the gateway computed it).
    """
    gateway = ToolGateway(settings)
    try:
        ledger = gateway._rt.ledger
        record = ledger.record(ledger.keys(first.session, first.run), first.call_id)
        assert record is not None, "the first call has no record"
        return record.row.integer(CallField.DEADLINE_MS) - first.submitted_ms
    finally:
        gateway.close()


def _executions(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    options = _parse(argv)
    logging.basicConfig(level=logging.ERROR)  # failovers are the plan: their warnings would drown the figures
    print(
        f"failover-sequence: seed {options.seed} replicas {options.replicas} door {options.door}"
        f" (replay: --seed {options.seed})",
        flush=True,
    )
    outcome = run(options)
    for example in outcome.examples[:15]:
        print(f"  {example}")
    print(outcome.line(), flush=True)
    return 0 if outcome.passed else 1


if __name__ == "__main__":
    sys.exit(main())
