"""Counters of the task messages workers refused (``P:refused``), by reason.

Counted in Redis, not in the worker process, so that every pool child adds to the same
numbers and the metrics exporter reads them on each scrape like the rest of the ledger.
"""

from __future__ import annotations

import redis

from workers.core.refusals import RefusalReason
from workers.store.keys import refused_key
from workers.store.ledger import store_errors
from workers.store.records import REFUSED
from workers.store.rows import Row

__all__ = ["count_refusal", "refusal_counts"]


def count_refusal(client: redis.Redis, prefix: str, reason: RefusalReason) -> None:
    """Add one refused message of ``reason``; raises ``StoreError`` when Redis fails."""
    with store_errors():
        client.hincrby(refused_key(prefix), reason, 1)


def refusal_counts(client: redis.Redis, prefix: str) -> dict[RefusalReason, int]:
    """Refused messages so far, every reason present (0 when none)."""
    key = refused_key(prefix)
    with store_errors():
        row = Row(REFUSED, client.hgetall(key), where=key)
    return {reason: row.integer(reason) for reason in RefusalReason}
