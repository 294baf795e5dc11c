"""The watchdog's sweep over calls near or past their deadline, across all runs."""

from __future__ import annotations

from collections import defaultdict

from workers.reaping import reap
from workers.settings import Settings
from workers.store.keys import RunKeys, due_index_key, parse_due_member
from workers.store.ledger import Ledger, store_errors

__all__ = ["sweep_due_calls"]


def sweep_due_calls(
    ledger: Ledger, *, now_ms: int, settings: Settings, writer: str, limit: int = 10_000
) -> int:
    """Answer overdue and lost calls; cost grows with the calls due, not with all calls.

    A call is looked at when its deadline has passed or when it could have lost its lease
    (it was submitted more than one lease TTL ago).
    """
    lease_ms = int(settings.lease.ttl_s * 1000)
    horizon = now_ms + int(settings.limits.queue_allowance_s * 1000) + 24 * 3600 * 1000
    with store_errors():
        members = ledger.client.zrangebyscore(due_index_key(ledger.prefix), 0, horizon, start=0, num=limit)
    runs: dict[RunKeys, list[str]] = defaultdict(list)
    for member in members:
        keys, call_id = parse_due_member(ledger.prefix, str(member))
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
