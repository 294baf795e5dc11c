"""The sweep's probe of due calls: one pipelined read, the decision in Python, on every deployment.

Candidates come by score from every bucket's due and lease indexes, then each one's record
and lease are read in one pipeline, judged by :func:`_probe_verdict`, and stale index
members are fixed in another pipeline. The sweep lock keeps two sweeps from fixing the same
members; a call that changes between the read and the fix is only re-scored or dropped from
an index (hints, re-checked against the record), and a call reaped is answered through
``Ledger.reap``, which checks its record again atomically.
"""

from __future__ import annotations

import redis

from workers.core.models import CallState
from workers.core.reaping import DueVerdict
from workers.store.connection import store_errors
from workers.store.keys import RunKeys, all_index_keys, parse_due_member
from workers.store.ledger import Ledger
from workers.store.records import CALL, CallField, Row

__all__ = ["PROBED_FIELDS", "bucket_ranges", "probe_due_calls"]

PROBED_FIELDS = (CallField.STATE, CallField.DEADLINE_MS, CallField.SUBMITTED_MS, CallField.DISPATCHED)


def _probe_verdict(row: Row[CallField], lease_left_ms: int, *, now_ms: int, lease_ms: int) -> DueVerdict:
    """What the sweep does with one candidate.

    The record's fields read with their declared defaults: a missing deadline is overdue, a
    missing submission time long past.
    """
    state = row.raw(CallField.STATE)
    if state is None or state == CallState.DONE:
        return DueVerdict.DROP
    if row.integer(CallField.DEADLINE_MS) <= now_ms:
        return DueVerdict.REAP
    if state == CallState.RUNNING:
        return DueVerdict.REAP if lease_left_ms == -2 else DueVerdict.RESCORE
    if row.flag(CallField.DISPATCHED):
        return DueVerdict.UNHOLD
    return DueVerdict.REAP if row.integer(CallField.SUBMITTED_MS) <= now_ms - lease_ms else DueVerdict.KEEP


def bucket_ranges(
    client: redis.Redis, pairs: list[tuple[str, str]], high_first: int, high_second: int, limit: int
) -> list[list[str]]:
    """Per (first, second) index pair of a bucket, the members scored up to each one's bound.

    One round trip for every bucket; each range is O(log n + limit). Members of the first
    index come first, each member once.
    """
    pipe = client.pipeline(transaction=False)
    for first, second in pairs:
        pipe.zrangebyscore(first, float("-inf"), high_first, start=0, num=limit)
        pipe.zrangebyscore(second, float("-inf"), high_second, start=0, num=limit)
    replies = pipe.execute()
    return [
        [str(m) for m in dict.fromkeys([*replies[2 * n], *replies[2 * n + 1]])] for n in range(len(pairs))
    ]


def probe_due_calls(ledger: Ledger, *, now_ms: int, lease_ms: int, limit: int) -> list[tuple[RunKeys, str]]:
    """Calls to reap (overdue, lost, never dispatched); fixes or drops stale index members.

    Raises:
        StoreError: when Redis fails.
    """
    buckets = all_index_keys(ledger.prefix)
    with store_errors():
        pairs = [(b.due, b.leases) for b in buckets]
        members = [m for found in bucket_ranges(ledger.client, pairs, now_ms, now_ms, limit) for m in found]
        parsed = [parse_due_member(ledger.prefix, m) for m in members]
        pipe = ledger.client.pipeline(transaction=False)
        for keys, call_id in parsed:
            pipe.hmget(keys.call(call_id), PROBED_FIELDS)
            pipe.pttl(keys.lease(call_id))
        probes = pipe.execute() if parsed else []
        found: list[tuple[RunKeys, str]] = []
        fix = ledger.client.pipeline(transaction=False)
        for n, (member, (keys, call_id)) in enumerate(zip(members, parsed, strict=True)):
            left = int(probes[2 * n + 1])
            row = Row.zip(CALL, PROBED_FIELDS, probes[2 * n])
            verdict = _probe_verdict(row, left, now_ms=now_ms, lease_ms=lease_ms)
            due, leases = keys.index.due, keys.index.leases
            if verdict is DueVerdict.REAP:
                found.append((keys, call_id))
            elif verdict is DueVerdict.DROP:
                fix.zrem(due, member)
                fix.zrem(leases, member)
            elif verdict is DueVerdict.RESCORE:
                fix.zadd(leases, {member: now_ms + (left if left > 0 else lease_ms)})
                fix.zadd(due, {member: row.integer(CallField.DEADLINE_MS)}, xx=True)
            elif verdict is DueVerdict.UNHOLD:
                fix.zrem(leases, member)
                fix.zadd(due, {member: row.integer(CallField.DEADLINE_MS)}, xx=True)
        fix.execute()
    return found
