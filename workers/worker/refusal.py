"""What a worker does with a task message it will not run: log it, count it, answer its call.

Nothing here runs a tool. A refusal is logged with the message's task id and counted in
``P:refused`` by reason; a registered call whose message did not match it is answered
``call_mismatch`` (first writer wins, so an answer already written stands), unless a live
worker is running the registered job, which answers it itself.
"""

from __future__ import annotations

import logging

from workers.answering.service import Answers
from workers.core.models import CallJob, ClaimStatus
from workers.core.refusal import RefusalReason, mismatch_result, refusal_of
from workers.errors import StoreError
from workers.store.keys import RunKeys
from workers.store.ledger import Claim, Ledger
from workers.store.refusal import count_refusal

__all__ = ["record_refusal", "refuse_claim"]

log = logging.getLogger(__name__)


def record_refusal(
    ledger: Ledger, task_id: str, reason: RefusalReason, detail: str, *, kind: str = "invoke"
) -> None:
    """Log one refused message with its task id and count it; a store failure only loses the count."""
    log.warning("refused %s message %s (%s): %s", kind, task_id, reason.value, detail)
    try:
        count_refusal(ledger.client, ledger.prefix, reason, ttl_s=ledger.ttl_s)
    except StoreError as exc:
        log.warning("could not count refused message %s: %s", task_id, exc)


def refuse_claim(
    ledger: Ledger, keys: RunKeys, job: CallJob, claim: Claim, *, task_id: str, answers: Answers, now_ms: int
) -> bool:
    """Handle a claim the ledger refused; False when ``claim`` is no refusal (the caller goes on)."""
    reason = refusal_of(claim.status)
    if reason is None:
        return False
    where = f"call {job.call.id!r} of {job.session_key}/{job.run_id}"
    if claim.status is ClaimStatus.UNREGISTERED:
        record_refusal(ledger, task_id, reason, f"{where} was never registered")
        return True
    record_refusal(
        ledger,
        task_id,
        reason,
        f"{where} was registered as tool {claim.registered_tool!r}; the message (tool {job.call.name!r})"
        " is not the job registered",
    )
    if claim.status is ClaimStatus.MISMATCH:
        # Stored as it is: no fallback covers a refusal (failure_policy.FALLBACK_REASONS).
        answer = mismatch_result(job.call.id, claim.registered_tool, elapsed_ms=0)
        answers.offer(keys, answer, now_ms=now_ms).on(ledger)
    return True
