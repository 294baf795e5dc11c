"""Counters of the task messages workers refused (``P:refused``), by reason.

Counted in Redis, not in the worker process, so that every pool child adds to the same
numbers and the metrics exporter reads them on each scrape like the rest of the ledger.
"""

from __future__ import annotations

import redis

from workers.core.refusal import RefusalReason
from workers.store.connection import store_errors
from workers.store.keys import refused_key
from workers.store.records import REFUSED, Row

__all__ = ["count_refusal", "refusal_counts"]


def count_refusal(client: redis.Redis, prefix: str, reason: RefusalReason, *, ttl_s: int) -> None:
    """Add one refused message of ``reason``; raises ``StoreError`` when Redis fails.

    Like every key, the counters expire (``ttl_s`` after the latest refusal): Prometheus reads
    the reset as a counter reset, which ``increase()`` handles.
    """
    key = refused_key(prefix)
    with store_errors():
        pipe = client.pipeline(transaction=True)
        pipe.hincrby(key, reason, 1)
        pipe.expire(key, ttl_s)
        pipe.execute()


def refusal_counts(client: redis.Redis, prefix: str) -> dict[RefusalReason, int]:
    """Refused messages so far, every reason present (0 when none)."""
    key = refused_key(prefix)
    with store_errors():
        row = Row(REFUSED, client.hgetall(key), where=key)
    return {reason: row.integer(reason) for reason in RefusalReason}
