"""What a worker does when it claims a call an earlier attempt already started: log it, count it.

The tool still runs (execution is at least once; the tool gets the same
``ctx.idempotency_key`` as the first execution). Whichever result reaches the ledger first is
the one delivered; a later one is kept as late (``ledger_finish.lua``), so the second
execution's result never replaces a result already delivered.
"""

from __future__ import annotations

import logging

from workers.core.idempotency import idempotency_key
from workers.errors import StoreError
from workers.store.claims import Claim
from workers.store.duplicates import count_duplicate
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger

__all__ = ["note_duplicate"]

log = logging.getLogger(__name__)


def note_duplicate(ledger: Ledger, keys: RunKeys, call_id: str, claim: Claim, *, worker: str) -> None:
    """Log and count ``claim`` if it executes the call again; a store failure only loses the count."""
    if not claim.executes_again:
        return
    log.warning(
        "duplicate execution of call %r of %s/%s (idempotency key %s): attempt %d by %s;"
        " attempt %d was claimed by %s at %d ms",
        call_id,
        keys.session_key,
        keys.run_id,
        idempotency_key(keys.session_key, keys.run_id, call_id),
        claim.attempt,
        worker,
        claim.attempt - 1,
        claim.previous_worker or "?",
        claim.previous_started_ms,
    )
    try:
        count_duplicate(ledger.client, ledger.prefix, ttl_s=ledger.ttl_s)
    except StoreError as exc:
        log.warning("could not count the duplicate execution of call %r: %s", call_id, exc)
