"""Prometheus metrics computed from the ledger on every scrape: what Flower cannot see.

:class:`LedgerCollector` reads the ledger (through :class:`workers.store.ledger_scan.LedgerScanner`)
when Prometheus scrapes, so the numbers are the same for every process and nothing has to be
counted at the call sites. It exposes::

    unstuck_up                                  1 when Redis answered this scrape, else 0
    unstuck_calls{tool,outcome}                 call records by outcome: pending, running,
                                                ok, tool_error, synthetic
    unstuck_synthetic_results{reason}           answered calls whose result unstuck wrote
    unstuck_tool_duration_seconds{tool}         histogram of finished_ms - started_ms
    unstuck_pending_calls                       members of the due index (unanswered calls)
    unstuck_oldest_pending_call_age_seconds     now - submitted_ms of the oldest unanswered call
    unstuck_runs{status}                        run records by status
    unstuck_running_sessions                    runs with status running (one per session lane)
    unstuck_sessions{class}                     running runs by the watchdog's latest class
                                                (active, long_running, stalled, stuck, unclassified)
    unstuck_idle_streams                        model streams that went idle (idle guard), summed
                                                over the run records held now
    unstuck_watchdog_last_sweep_age_seconds     time since the last completed sweep (-1: none);
                                                alert when it exceeds two sweep intervals
    unstuck_watchdog_max_sweep_gap_seconds      the longest gap seen between two sweeps
    unstuck_scrape_keys / _truncated            how much of the keyspace this scrape read
    unstuck_refused_messages_total{reason}      task messages workers refused to run (counter):
                                                unreadable, unregistered, mismatch,
                                                tool_not_allowed
    unstuck_openclaw_tombstoned_sessions        OpenClaw sessions its restart recovery tombstoned,
                                                as the watchdog last read sessions.list
    unstuck_duplicate_executions_total          calls a worker claimed again after an earlier
                                                attempt (counter): second executions, each
                                                logged by the worker with both attempts
    unstuck_answers_restored_total              answers handed on with no replica in sync that a
                                                failover lost, written back by whoever handed
                                                them on (docs/failover.md, counter)
    unstuck_answers_restore_conflicts_total     such answers not written back: the ledger held
                                                another, decided before they were handed on

and, with ``tools.breakers`` set, the breakers' (:mod:`workers.ops.breaker`).

All but the counters are gauges: they describe the records Redis holds now,
which expire after ``ledger.ttl_s`` (24 h by default), so a "total" can go down. The
counters expire ``ledger.ttl_s`` after their latest count, which Prometheus
reads as a counter reset.

**Cost, and its bound.** Call and run records are found with one ``SCAN`` pass over the
run keys of the prefix (``COUNT`` 1000 per step), read with pipelined ``HMGET`` batches.
A scrape reads at most ``max_keys`` keys (default 20 000) and sets
``unstuck_scrape_truncated`` to 1 when it stopped early, so a huge ledger makes the numbers
partial, never the scrape unbounded; the default bound keeps a scrape near 1-2 s on a
2-core machine (docs/performance.md). The oldest pending call is looked for among the
``oldest_sample`` members of the due index with the nearest deadlines, because the index
is scored by deadline, not by submission time: a call submitted earlier with a later
deadline can be missed. This is acceptable until the store keeps per-tool counters.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from workers.core.models import CallState, SyntheticReason
from workers.errors import StoreError
from workers.store.duplicates import duplicate_count
from workers.store.kept_answers import kept_counts
from workers.store.ledger import Ledger
from workers.store.ledger_scan import CallRow, LedgerScanner
from workers.store.openclaw_calls import tombstone_count
from workers.store.refusal import refusal_counts
from workers.store.watchdog_liveness import WatchdogLiveness

__all__ = [
    "DURATION_BUCKETS_S",
    "CallRow",
    "LedgerCollector",
    "LedgerTally",
    "families",
    "outcome_of",
    "tally",
]

log = logging.getLogger(__name__)

DURATION_BUCKETS_S: Final = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
UNKNOWN_TOOL_LABEL: Final = "<unknown>"


@dataclass
class LedgerTally:
    """What one scrape found, before it becomes metric families."""

    calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    synthetic: Counter[str] = field(default_factory=Counter)
    durations_s: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    runs: Counter[str] = field(default_factory=Counter)
    classes: Counter[str] = field(default_factory=Counter)  # running runs by the watchdog's class
    idle_streams: int = 0
    last_sweep_ms: int | None = None
    max_sweep_gap_ms: int = 0
    keys_read: int = 0
    truncated: bool = False
    pending: int = 0
    oldest_submitted_ms: int | None = None
    refused: dict[str, int] = field(default_factory=dict)  # refused task messages by reason
    duplicates: int = 0  # second executions of calls
    openclaw_tombstones: int = 0  # OpenClaw sessions its restart recovery tombstoned
    kept: dict[str, int] = field(default_factory=dict)  # kept answers written back, conflicts


def outcome_of(state: str, reason: str) -> str:
    """``pending``/``running`` while open; ``ok``, ``tool_error`` or ``synthetic`` once answered."""
    if state != CallState.DONE.value:
        return state or CallState.PENDING.value
    if not reason:
        return "ok"
    return "tool_error" if reason == SyntheticReason.TOOL_ERROR.value else "synthetic"


def tally(rows: Iterable[CallRow], into: LedgerTally | None = None) -> LedgerTally:
    """Count calls by tool and outcome, synthetic results by reason, and durations by tool."""
    out = into or LedgerTally()
    for row in rows:
        # A model can invent any tool name; keep those out of the label set.
        tool = UNKNOWN_TOOL_LABEL if row.reason == SyntheticReason.UNKNOWN_TOOL.value else row.tool
        outcome = outcome_of(row.state, row.reason)
        out.calls[(tool, outcome)] += 1
        if outcome == "synthetic":
            out.synthetic[row.reason] += 1
        if row.state == CallState.DONE.value and row.started_ms and row.finished_ms:
            out.durations_s[tool].append(max(0, row.finished_ms - row.started_ms) / 1000)
    return out


class LedgerCollector(Collector):
    """A Prometheus collector that reads the ledger on every scrape (see the module docstring)."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        max_keys: int = 20_000,
        oldest_sample: int = 1000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ledger = ledger
        self.scanner = LedgerScanner(ledger, max_keys=max_keys)
        self.liveness = WatchdogLiveness(ledger)
        self.oldest_sample = oldest_sample
        self.clock = clock

    def describe(self) -> Iterable[Metric]:
        """Nothing: registering must not touch Redis."""
        return []

    def collect(self) -> Iterable[Metric]:
        """Read the ledger and yield every metric family; only ``unstuck_up 0`` if Redis fails."""
        now_ms = int(self.clock() * 1000)
        try:
            found = self.read()
        except StoreError as exc:
            log.warning("metrics: cannot read the ledger: %s", exc)
            yield GaugeMetricFamily("unstuck_up", "1 when Redis answered this scrape", value=0)
            return
        yield GaugeMetricFamily("unstuck_up", "1 when Redis answered this scrape", value=1)
        yield from families(found, now_ms)

    def read(self) -> LedgerTally:
        """One bounded pass over the ledger; raises ``StoreError`` when Redis fails."""
        scan = self.scanner.keys()
        out = tally(self.scanner.call_rows(scan.call_keys))
        out.keys_read, out.truncated = scan.keys_read, scan.truncated
        for run in self.scanner.run_rows(scan.run_keys):
            out.runs[run.status] += 1
            out.idle_streams += run.stream_idles
            if run.status == "running":
                out.classes[run.klass or "unclassified"] += 1
        sweep = self.liveness.last()
        if sweep is not None:
            out.last_sweep_ms, out.max_sweep_gap_ms = sweep.last_sweep_ms, sweep.max_gap_ms
        due = self.scanner.due_sample(self.oldest_sample)
        out.pending, out.oldest_submitted_ms = due.pending, due.oldest_submitted_ms
        out.refused = {str(r): n for r, n in refusal_counts(self.ledger.client, self.ledger.prefix).items()}
        out.duplicates = duplicate_count(self.ledger.client, self.ledger.prefix)
        out.openclaw_tombstones = tombstone_count(self.ledger.client, self.ledger.prefix)
        out.kept = kept_counts(self.ledger.client, self.ledger.prefix)
        return out


def _histogram(durations_s: dict[str, list[float]]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(
        "unstuck_tool_duration_seconds", "Run time of answered calls (finished - started)", labels=["tool"]
    )
    for tool, values in sorted(durations_s.items()):
        buckets = [(f"{bound:g}", float(sum(v <= bound for v in values))) for bound in DURATION_BUCKETS_S]
        buckets.append(("+Inf", float(len(values))))
        family.add_metric([tool], buckets, sum_value=sum(values))
    return family


def families(found: LedgerTally, now_ms: int) -> Iterator[Metric]:
    """The metric families of one scrape's tally."""
    calls = GaugeMetricFamily("unstuck_calls", "Call records by tool and outcome", labels=["tool", "outcome"])
    for (tool, outcome), count in sorted(found.calls.items()):
        calls.add_metric([tool, outcome], count)
    yield calls
    synthetic = GaugeMetricFamily(
        "unstuck_synthetic_results", "Answered calls whose result unstuck wrote", labels=["reason"]
    )
    for reason, count in sorted(found.synthetic.items()):
        synthetic.add_metric([reason], count)
    yield synthetic
    yield _histogram(found.durations_s)
    yield GaugeMetricFamily("unstuck_pending_calls", "Unanswered calls in the due index", value=found.pending)
    age_s = 0.0 if found.oldest_submitted_ms is None else max(0, now_ms - found.oldest_submitted_ms) / 1000
    yield GaugeMetricFamily(
        "unstuck_oldest_pending_call_age_seconds", "Age of the oldest unanswered call", value=age_s
    )
    runs = GaugeMetricFamily("unstuck_runs", "Run records by status", labels=["status"])
    for status, count in sorted(found.runs.items()):
        runs.add_metric([status], count)
    yield runs
    yield GaugeMetricFamily(
        "unstuck_running_sessions", "Runs with status running", value=found.runs.get("running", 0)
    )
    yield from _watch_families(found, now_ms)
    yield GaugeMetricFamily("unstuck_scrape_keys", "Keys read by this scrape", value=found.keys_read)
    yield GaugeMetricFamily(
        "unstuck_scrape_truncated", "1 when this scrape hit max_keys", value=int(found.truncated)
    )
    refused = CounterMetricFamily(
        "unstuck_refused_messages", "Task messages workers refused to run", labels=["reason"]
    )
    for reason, count in sorted(found.refused.items()):
        refused.add_metric([reason], count)
    yield refused
    yield GaugeMetricFamily(
        "unstuck_openclaw_tombstoned_sessions",
        "OpenClaw sessions its restart recovery tombstoned (alerted, not yet reset)",
        value=found.openclaw_tombstones,
    )
    yield CounterMetricFamily(
        "unstuck_duplicate_executions",
        "Calls a worker claimed again after an earlier attempt (second executions)",
        value=found.duplicates,
    )
    yield CounterMetricFamily(
        "unstuck_answers_restored",
        "Answers handed on that a failover lost, written back by whoever handed them on",
        value=found.kept.get("restored", 0),
    )
    yield CounterMetricFamily(
        "unstuck_answers_restore_conflicts",
        "Answers a failover lost that were not written back: the ledger held another, decided first",
        value=found.kept.get("conflict", 0),
    )


def _watch_families(found: LedgerTally, now_ms: int) -> Iterator[Metric]:
    """What the watchdog sees of sessions, and how the watchdog itself is doing."""
    classes = GaugeMetricFamily(
        "unstuck_sessions", "Running runs by the watchdog's latest class", labels=["class"]
    )
    for klass, count in sorted(found.classes.items()):
        classes.add_metric([klass], count)
    yield classes
    yield GaugeMetricFamily(
        "unstuck_idle_streams",
        "Model streams that went idle past their timeout (runs held now)",
        value=found.idle_streams,
    )
    # -1 when no sweep completed within the record's TTL: a watchdog that never ran.
    age_s = -1.0 if found.last_sweep_ms is None else max(0, now_ms - found.last_sweep_ms) / 1000
    yield GaugeMetricFamily(
        "unstuck_watchdog_last_sweep_age_seconds", "Time since the last completed watchdog sweep", value=age_s
    )
    yield GaugeMetricFamily(
        "unstuck_watchdog_max_sweep_gap_seconds",
        "Longest gap seen between two completed sweeps",
        value=found.max_sweep_gap_ms / 1000,
    )
