"""The count of second executions (``P:duplicates``): calls a worker claimed again.

Execution is at least once: a call whose worker was lost (an idempotent tool re-run), or whose
claim a Redis failover discarded, can run twice. Every claim that finds an earlier attempt
(``ledger_claim.lua`` returns it) adds one here. Counted in Redis, like the refused messages,
so every pool child adds to the same number and the metrics exporter reads it on each scrape.
"""

from __future__ import annotations

import redis

from workers.store.connection import store_errors
from workers.store.keys import duplicates_key

__all__ = ["count_duplicate", "duplicate_count"]


def count_duplicate(client: redis.Redis, prefix: str, *, ttl_s: int) -> None:
    """Add one second execution; raises ``StoreError`` when Redis fails.

    The counter expires ``ttl_s`` after the latest one, which Prometheus reads as a reset.
    """
    key = duplicates_key(prefix)
    with store_errors():
        pipe = client.pipeline(transaction=True)
        pipe.incr(key)
        pipe.expire(key, ttl_s)
        pipe.execute()


def duplicate_count(client: redis.Redis, prefix: str) -> int:
    """Second executions counted so far (0 when none, or since the counter expired)."""
    with store_errors():
        raw = client.get(duplicates_key(prefix))
    return int(raw or 0)
