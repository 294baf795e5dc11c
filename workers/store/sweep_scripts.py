"""The sweep's server-side phases: one script per phase over every due item (single Redis node).

The pipelined path (:func:`workers.store.sweep_probe.probe_due_calls` and :class:`SessionStore`
reads) reads each due item's record and parses every reply in Python; with 10 000 due runs
that is over a second (``BENCH_PATH=pipelined python -m bench.watchdog``). These scripts
do the same reads inside Redis and return only what needs the client: calls to reap, and
runs that need an alert, an action or a drop. They read keys of many runs, which Redis
Cluster refuses, so :func:`server_side_ok` keeps cluster clients on the pipelined path. The
key grammar they rebuild from index members is documented in :mod:`workers.store.keys`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from workers.store.keys import (
    RunKeys,
    due_index_key,
    lease_index_key,
    parse_due_member,
    parse_run_member,
    run_index_keys,
)
from workers.store.ledger import Ledger, store_errors
from workers.store.lua import load_script

__all__ = ["RunSweep", "SweepScripts", "server_side_ok"]


def server_side_ok(ledger: Ledger) -> bool:
    """Whether ``ledger``'s client talks to a single Redis node, where cross-slot scripts may run."""
    return isinstance(ledger.client, redis.Redis)


@dataclass(frozen=True)
class RunSweep:
    """The run phase's outcome: runs settled in Redis by class, and runs left to the caller."""

    settled: dict[str, int]
    rest: list[tuple[str, str]]


class SweepScripts:
    """Runs the sweep's phases as scripts; raises ``StoreError`` on Redis failure."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._calls = load_script(ledger.client, "sweep_calls.lua")
        self._runs = load_script(ledger.client, "sweep_runs.lua")

    def due_calls(self, *, now_ms: int, lease_ms: int, limit: int) -> list[tuple[RunKeys, str]]:
        """Calls to reap (overdue, lost, never dispatched); fixes or drops stale index members."""
        prefix = self.ledger.prefix
        with store_errors():
            members: Any = self._calls(
                keys=[due_index_key(prefix), lease_index_key(prefix)], args=[prefix, now_ms, lease_ms, limit]
            )
        return [parse_due_member(prefix, str(m)) for m in members]

    def runs(self, *, now_ms: int, stalled_after_ms: int, auto_recover: bool, limit: int) -> RunSweep:
        """Classify the due runs; settle the steady ones in Redis, return the others."""
        index = run_index_keys(self.ledger.prefix)
        args: list[str | int] = [
            self.ledger.prefix,
            now_ms,
            stalled_after_ms,
            int(auto_recover),
            limit,
        ]
        with store_errors():
            counts, rest = self._runs(keys=[index.by_deadline, index.by_progress], args=args)
        settled = {str(counts[n]): int(counts[n + 1]) for n in range(0, len(counts), 2)}
        return RunSweep(settled, [parse_run_member(str(m)) for m in rest])
