"""The sweep's run phase as a script over pages of each index bucket (single Redis node).

The one sweep decision kept in Lua beside its Python original
(:func:`workers.core.run_health.judge`), because the sweep target needs it: judging 10 000
due runs in Python misses ``bench.watchdog``'s 50 ms (docs/performance.md, "Decisions kept
in Lua"). ``sweep_runs.lua`` reads records inside Redis and returns only the runs that need
an alert, an action or a drop. It is sent only each bucket's two index keys: it reads the
bucket's due runs by score itself, at most :data:`SWEEP_PAGE` of each index per call (so no
call holds Redis for long), and builds each run's record key from its member; every
bucket's first page goes in one round trip. It reads keys in many slots, which Redis
Cluster refuses, so :func:`server_side_ok` keeps cluster clients on the pipelined path
(:class:`SessionStore` reads, judged in Python). The key grammar is documented in
:mod:`workers.store.keys`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from workers.store.connection import store_errors
from workers.store.keys import all_index_keys, parse_run_member
from workers.store.ledger import Ledger
from workers.store.lua import load_script

__all__ = ["SWEEP_PAGE", "RunSweep", "SweepScripts", "server_side_ok"]

#: Members per script call (of each index), so one call holds Redis a few ms at most: 10 000
#: due runs take 50-80 ms of Redis time on a loaded 2-core machine (bench.watchdog), so a call
#: reading 200 of each index (at most 400 runs) stays well under 10 ms, and 64 buckets of
#: 10 000 due runs (about 160 each) still need one call per bucket.
SWEEP_PAGE = 200


def server_side_ok(ledger: Ledger) -> bool:
    """Whether ``ledger``'s client talks to a single Redis node, where cross-slot scripts may run."""
    return isinstance(ledger.client, redis.Redis)


@dataclass(frozen=True)
class RunSweep:
    """The run phase's outcome: runs settled in Redis by class, and runs left to the caller."""

    settled: dict[str, int]
    rest: list[tuple[str, str]]


class SweepScripts:
    """Runs the sweep's run phase as a script; raises ``StoreError`` on Redis failure."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.client = ledger.client
        self._runs = load_script(ledger.client, "sweep_runs.lua")

    def _evaluate(self, script: Script, calls: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
        """Run ``script`` once per (keys, args) in one pipeline; loads it once if Redis lost it."""
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            for keys, args in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            try:
                return pipe.execute() if calls else []
            except NoScriptError:
                if attempt == 2:
                    raise
                self.client.script_load(script.script)
        return []

    def runs(self, *, now_ms: int, stalled_after_ms: int, auto_recover: bool, limit: int) -> RunSweep:
        """Classify the due runs; settle the steady ones in Redis, return the others.

        Every bucket's first page in one round trip; a bucket whose page came back full is
        paged on, skipping what earlier pages left in its ranges, until ``limit`` members of
        each index were read.
        """
        prefix = self.ledger.prefix
        common = [now_ms, stalled_after_ms, int(auto_recover), prefix, SWEEP_PAGE]
        todo = {n: (0, 0) for n in range(len(all_index_keys(prefix)))}  # bucket: skip (deadline, quiet)
        read = dict.fromkeys(todo, 0)
        buckets = all_index_keys(prefix)
        settled: dict[str, int] = {}
        rest: list[tuple[str, str]] = []
        with store_errors():
            while todo:
                calls = [
                    ([buckets[n].by_deadline, buckets[n].by_progress], [*common, *skip])
                    for n, skip in todo.items()
                ]
                replies = self._evaluate(self._runs, calls)
                following: dict[int, tuple[int, int]] = {}
                for (n, (skip_due, skip_quiet)), reply in zip(todo.items(), replies, strict=True):
                    counts, left, due_n, quiet_n, stayed = reply
                    for k in range(0, len(counts), 2):
                        settled[str(counts[k])] = settled.get(str(counts[k]), 0) + int(counts[k + 1])
                    rest.extend(parse_run_member(str(m)) for m in left)
                    read[n] += max(int(due_n), int(quiet_n))
                    if SWEEP_PAGE in (int(due_n), int(quiet_n)) and read[n] < limit:
                        following[n] = (skip_due + int(due_n), skip_quiet + int(stayed))
                todo = following
        return RunSweep(settled, list(dict.fromkeys(rest)))  # a run in both ranges of two pages: once
