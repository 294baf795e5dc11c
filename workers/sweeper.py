"""The watchdog's sweep over unanswered calls, across all runs."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from workers.reaping import reap
from workers.settings import Settings
from workers.store.keys import RunKeys, due_index_key, parse_due_member
from workers.store.ledger import Ledger, store_errors
from workers.store.sweeps import SweepScripts

__all__ = ["sweep_due_calls"]


def _needs_reap(row: list[object], lease_alive: int, deadline_ms: int, now_ms: int, lease_ms: int) -> bool:
    state, submitted, dispatched = row
    if deadline_ms <= now_ms:
        return True
    if state == "running":
        return not lease_alive
    old = int(str(submitted or 0)) <= now_ms - lease_ms
    return state == "pending" and dispatched != "1" and old


def _probe(ledger: Ledger, *, now_ms: int, lease_ms: int, limit: int) -> list[tuple[RunKeys, str]]:
    """The pipelined (cluster-safe) probe: every unanswered call's state and lease, one round trip."""
    with store_errors():
        members: Any = ledger.client.zrange(due_index_key(ledger.prefix), 0, limit - 1, withscores=True)
        parsed = [(*parse_due_member(ledger.prefix, str(m)), int(score)) for m, score in members]
        pipe = ledger.client.pipeline(transaction=False)
        for keys, call_id, _ in parsed:
            pipe.hmget(keys.call(call_id), ["state", "submitted_ms", "dispatched"])
            pipe.exists(keys.lease(call_id))
        probes = pipe.execute() if parsed else []
    found: list[tuple[RunKeys, str]] = []
    gone: list[str] = []
    for n, (keys, call_id, deadline_ms) in enumerate(parsed):
        if probes[2 * n][0] is None:  # the record expired: the index member is a stale hint
            gone.append(keys.due_member(call_id))
        elif _needs_reap(probes[2 * n], probes[2 * n + 1], deadline_ms, now_ms, lease_ms):
            found.append((keys, call_id))
    if gone:
        with store_errors():
            ledger.client.zrem(due_index_key(ledger.prefix), *gone)
    return found


def sweep_due_calls(
    ledger: Ledger,
    *,
    now_ms: int,
    settings: Settings,
    writer: str,
    limit: int = 10_000,
    scripts: SweepScripts | None = None,
) -> int:
    """Answer overdue and lost calls; returns how many were answered.

    Overdue calls come straight from the due index (scored by deadline). A lost worker is
    not visible in any score, so every unanswered call in the index is probed (state and
    lease): inside Redis with ``scripts`` (one round trip, single node), else pipelined.
    Only the runs with an overdue, lost or never-dispatched call are then read in full and
    reaped.
    """
    lease_ms = int(settings.lease.ttl_s * 1000)
    if scripts is not None:
        found = scripts.due_calls(now_ms=now_ms, lease_ms=lease_ms, limit=limit)
    else:
        found = _probe(ledger, now_ms=now_ms, lease_ms=lease_ms, limit=limit)
    runs: dict[RunKeys, list[str]] = defaultdict(list)
    for keys, call_id in found:
        runs[keys].append(call_id)
    answered = 0
    for keys, call_ids in runs.items():
        answered += reap(
            ledger,
            keys,
            call_ids,
            now_ms=now_ms,
            min_rerun_ms=lease_ms,
            writer=writer,
            redispatch=None,
            undispatched_after_ms=lease_ms,
        )
    return answered
