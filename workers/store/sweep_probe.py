"""The sweep's pipelined probe of due calls: cluster-safe, the same rules as ``sweep_calls.lua``.

Used when the sweep cannot run :class:`~workers.store.sweep_scripts.SweepScripts` (a Redis
Cluster client, or ``server_side=False``): candidates come by score from the due and lease
indexes, then each one's record and lease are read in one pipeline and stale index members
are fixed in another.
"""

from __future__ import annotations

from typing import Any

from workers.store.keys import RunKeys, due_index_key, lease_index_key, parse_due_member
from workers.store.ledger import Ledger, parse_int, store_errors

__all__ = ["probe_due_calls"]

_PROBED = ["state", "deadline_ms", "submitted_ms", "dispatched"]


def _probe_verdict(fields: list[Any], lease_left_ms: int, *, now_ms: int, lease_ms: int) -> str:
    """What the sweep does with one candidate; the same rules as ``sweep_calls.lua``.

    ``reap``, ``drop`` (record gone or answered: leave both indexes), ``rescore`` (lease
    alive: index lagging), ``unhold`` (pending in the queue: leave the lease index) or ``keep``.
    """
    state, deadline, submitted, dispatched = fields
    if state is None or state == "done":
        return "drop"
    if parse_int(deadline) <= now_ms:
        return "reap"
    if state == "running":
        return "reap" if lease_left_ms == -2 else "rescore"
    if dispatched == "1":
        return "unhold"
    return "reap" if parse_int(submitted) <= now_ms - lease_ms else "keep"


def _candidates(ledger: Ledger, now_ms: int, limit: int) -> list[str]:
    """Members past their deadline or their recorded lease, by score: O(due)."""
    pipe = ledger.client.pipeline(transaction=False)
    for index in (due_index_key(ledger.prefix), lease_index_key(ledger.prefix)):
        pipe.zrangebyscore(index, float("-inf"), now_ms, start=0, num=limit)
    overdue, lapsed = pipe.execute()
    return [str(m) for m in dict.fromkeys([*overdue, *lapsed])]


def probe_due_calls(ledger: Ledger, *, now_ms: int, lease_ms: int, limit: int) -> list[tuple[RunKeys, str]]:
    """Calls to reap (overdue, lost, never dispatched); fixes or drops stale index members.

    Raises:
        StoreError: when Redis fails.
    """
    due, leases = due_index_key(ledger.prefix), lease_index_key(ledger.prefix)
    with store_errors():
        members = _candidates(ledger, now_ms, limit)
        parsed = [parse_due_member(ledger.prefix, m) for m in members]
        pipe = ledger.client.pipeline(transaction=False)
        for keys, call_id in parsed:
            pipe.hmget(keys.call(call_id), _PROBED)
            pipe.pttl(keys.lease(call_id))
        probes = pipe.execute() if parsed else []
        found: list[tuple[RunKeys, str]] = []
        fix = ledger.client.pipeline(transaction=False)
        for n, (member, (keys, call_id)) in enumerate(zip(members, parsed, strict=True)):
            left = int(probes[2 * n + 1])
            verdict = _probe_verdict(probes[2 * n], left, now_ms=now_ms, lease_ms=lease_ms)
            if verdict == "reap":
                found.append((keys, call_id))
            elif verdict == "drop":
                fix.zrem(due, member)
                fix.zrem(leases, member)
            elif verdict == "rescore":
                fix.zadd(leases, {member: now_ms + (left if left > 0 else lease_ms)}, xx=True)
            elif verdict == "unhold":
                fix.zrem(leases, member)
        fix.execute()
    return found
