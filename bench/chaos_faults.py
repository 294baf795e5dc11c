"""The chaos soak's faults against the safety net itself, and the watchdog's own pulse.

* :class:`SweepPulse` watches every completed sweep (``P:{runs}:watchdog``) for the whole run;
  the gaps between sweeps must stay within the interval + 1 s, a gap across a Redis outage
  counted from the outage's end + :data:`RECONNECT_MS` (the watchdog cannot sweep a store
  that is not there);
* :func:`hog_every_slot` fills every pool slot with tools that ignore their limits;
* :func:`kill_everything` SIGKILLs every tool worker host and the agent processes of some
  unattended runs at once: only the watchdog is left to answer those calls;
* :func:`unexpected_task_errors` reads the workers' logs for tasks that raised what no task
  should (a ``TypeError`` in our own code answers a call ``crashed`` like a real crash does,
  so only the logs tell them apart).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tests.harness import Proc, kill_pids, wait_until
from workers import ToolCall, ToolGateway, ToolResult
from workers.errors import LoopDetected, StoreError
from workers.settings import Settings
from workers.store.ledger import Ledger
from workers.store.records import CallField
from workers.store.watchdog_liveness import SweepRecord, WatchdogLiveness

__all__ = [
    "RECONNECT_MS",
    "SweepPulse",
    "Unattended",
    "hog_every_slot",
    "kill_everything",
    "unattended_failures",
    "unexpected_task_errors",
]

_UNATTENDED = """
import sys
from workers import ToolCall, ToolGateway, ToolResult
print("submitting", flush=True)
ToolGateway().call_tools(
    session_key=sys.argv[1], run_id="r1", calls=[ToolCall(id="u0", name="slow", arguments={"seconds": 30})]
)
"""


#: How long after a Redis outage (or a failover episode) the watchdog may take to sweep again,
#: beyond its interval + 1 s: the restarted Redis loads its AOF, beat's publish and the watchdog's
#: broker consumer reconnect (each within about a second), and one deciding write may wait out a
#: WAIT timeout; 5 s leaves room for a loaded machine and still catches a watchdog locked out.
RECONNECT_MS = 5000


@dataclass
class SweepPulse:
    """Every sweep gap of the run, as the watchdog itself recorded it, and the outages to excuse.

    Each completed sweep's record names the gap before it (``last_gap_ms``), so a gap is
    exact even when this thread, polling, saw the sweeps on either side of it late. When it
    missed whole sweeps (the sweep counter jumped) and the watchdog's worst gap grew
    meanwhile, that unseen gap is placed as late as it can have ended.
    """

    ledger: Ledger
    sweeps_ms: list[int] = field(default_factory=list)
    gaps_ms: list[tuple[int, int]] = field(default_factory=list)  # (previous sweep, this sweep)
    outages_ms: list[tuple[int, int]] = field(default_factory=list)
    missed: int = 0
    started_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    _seen: SweepRecord | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> SweepPulse:
        self._thread = threading.Thread(target=self._run, name="sweep-pulse", daemon=True)
        self._thread.start()
        return self

    def outage(self, began_ms: int, ended_ms: int) -> None:
        self.outages_ms.append((began_ms, ended_ms))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        liveness = WatchdogLiveness(self.ledger)
        while not self._stop.wait(0.05):
            with contextlib.suppress(StoreError):
                record = liveness.last()
                if record is not None and (not self.sweeps_ms or record.last_sweep_ms > self.sweeps_ms[-1]):
                    self.note(record)

    def note(self, record: SweepRecord) -> None:
        """A sweep record newer than the last one seen."""
        seen, self._seen = self._seen, record
        self.sweeps_ms.append(record.last_sweep_ms)
        previous_ms = record.last_sweep_ms - record.last_gap_ms
        if record.last_gap_ms >= 0 and previous_ms >= self.started_ms:
            self.gaps_ms.append((previous_ms, record.last_sweep_ms))
        if seen is not None and record.sweeps > seen.sweeps + 1:
            self.missed += record.sweeps - seen.sweeps - 1
            if record.max_gap_ms > max(seen.max_gap_ms, record.last_gap_ms):
                self.gaps_ms.append((previous_ms - record.max_gap_ms, previous_ms))

    def worst_gap(self, reconnect_ms: int) -> tuple[int, str]:
        """The longest wait for a sweep the watchdog can be blamed for, and where it was.

        A gap across a Redis outage counts from the outage's end + ``reconnect_ms`` (the
        watchdog cannot sweep a store that is not there), so a watchdog slow to come back after
        the outage is still seen.
        """
        worst, where = 0, "no gap"
        first = self.started_ms
        for a, b in self.gaps_ms:
            overlapping = [(s, e) for s, e in self.outages_ms if a < e + reconnect_ms and b > s]
            counted_from = max([a, *(end + reconnect_ms for _, end in overlapping)])
            if b - counted_from > worst:
                worst = b - counted_from
                where = f"sweeps at +{a - first} and +{b - first} ms" + "".join(
                    f", after an outage +{start - first}..+{end - first} ms" for start, end in overlapping
                )
        return worst, where


def hog_every_slot(
    settings: Settings,
    slots: int,
    seconds: float,
    deliver: Callable[[str, str, list[ToolCall], list[ToolResult]], None],
) -> threading.Thread:
    """A session whose calls hold every pool slot for ``seconds``, ignoring every interrupt."""
    calls = [ToolCall(id=f"h{i}", name="hog", arguments={"seconds": seconds}) for i in range(slots)]

    def run() -> None:
        gateway = ToolGateway(settings)
        try:
            results = gateway.call_tools(session_key="chaos-hog", run_id="r1", calls=calls)
        except LoopDetected as exc:
            results = list(exc.results)
        finally:
            gateway.close()
        deliver("chaos-hog", "r1", calls, results)

    thread = threading.Thread(target=run, name="chaos-hog", daemon=True)
    thread.start()
    return thread


@dataclass(frozen=True)
class Unattended:
    """A run whose agent process was killed with every worker: only the watchdog can answer it."""

    session: str
    killed_ms: int
    was_running: bool  # its call ran on a worker at the kill (else it waits in the queue)


def kill_everything(
    env: dict[str, str], ledger: Ledger, workers: list[Proc], n: int, count: int = 3
) -> tuple[list[Unattended], list[int]]:
    """Start ``count`` agent processes with a running call each, then SIGKILL them and every worker host.

    Returns the unattended runs and the orphaned pids to reap at the end.
    """
    sessions = [f"chaos-lone-{n}-{i}" for i in range(count)]
    agents = [
        Proc([sys.executable, "-c", _UNATTENDED, s], env, f"chaos-lone{n}-{i}")
        for i, s in enumerate(sessions)
    ]

    with contextlib.suppress(AssertionError):  # slots may be hogged: kill whatever state it is in
        wait_until(lambda: all(_running(ledger, s) for s in sessions), timeout_s=15, what="calls running")
    was_running = {s: _running(ledger, s) for s in sessions}
    strays = [pid for proc in workers for pid in proc.children()]
    for proc in [*agents, *workers]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    killed_ms = int(time.time() * 1000)
    for proc in [*agents, *workers]:
        proc.stop(timeout_s=1)
    kill_pids(strays)
    return [Unattended(s, killed_ms, was_running[s]) for s in sessions], strays


def _running(ledger: Ledger, session: str) -> bool:
    try:
        record = ledger.record(ledger.keys(session, "r1"), "u0")
    except StoreError:
        return False
    return record is not None and record.state.value == "running"


def unattended_failures(
    ledger: Ledger, runs: list[Unattended], budget_ms: int, sweeps_ms: list[int]
) -> list[str]:
    """Each unattended call must be answered in the ledger, by the watchdog, within ``budget_ms``.

    A late answer names its timeline relative to the kill: when its worker claimed it (its
    lease, renewed until the kill, ran out at most one lease TTL after it) and every sweep
    seen until the answer.
    """
    failures = []
    for run in (r for r in runs if r.was_running):
        keys = ledger.keys(run.session, "r1")
        record = ledger.record(keys, "u0")
        if record is None:
            continue  # never registered before the kill: nothing to answer
        if record.result is None:
            failures.append(f"unattended {run.session}: no result in the ledger")
            continue
        writer = record.row.text(CallField.WRITER)
        took_ms = record.row.integer(CallField.FINISHED_MS) - run.killed_ms
        if not writer.endswith("/watchdog") or took_ms > budget_ms:
            finished_ms = record.row.integer(CallField.FINISHED_MS)
            claimed = record.row.integer(CallField.STARTED_MS) - run.killed_ms
            sweeps = [t - run.killed_ms for t in sweeps_ms if run.killed_ms - 2000 <= t <= finished_ms]
            failures.append(
                f"unattended {run.session}: answered by {writer!r} {took_ms} ms after the kill "
                f"(claimed {claimed:+d} ms, sweeps at {sweeps} ms)"
            )
    return failures


_UNEXPECTED = re.compile(r"\] Task .* raised unexpected: (\w+)\(")


def _store_errors(cls: type[BaseException] = StoreError) -> frozenset[str]:
    return frozenset({cls.__name__}).union(*(_store_errors(sub) for sub in cls.__subclasses__()))


#: What a task may raise under the soak's faults, its answer then delivered by whoever decides
#: it next: Redis gone or refusing (``StoreError`` and below), and a soft time limit that fires
#: after the tool returned, while the worker writes its answer (a deciding write waits up to a
#: second for its replica).
_EXPECTED_INTERRUPTS = frozenset({"SoftTimeLimitExceeded"}) | _store_errors()


def unexpected_task_errors(logs: Iterable[str]) -> Counter[str]:
    """Per exception type, the tasks of the logs (worker, watchdog) that raised what none should."""
    found: Counter[str] = Counter()
    for log in logs:
        for match in _UNEXPECTED.finditer(log):
            if match.group(1) not in _EXPECTED_INTERRUPTS:
                found[match.group(1)] += 1
    return found
