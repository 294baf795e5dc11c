"""Apply the reaper's decisions to the ledger: answer lost or overdue calls, re-run idempotent ones."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from workers.core.models import SyntheticReason
from workers.core.reaper import ActionKind, answer_open_call, decide
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger

__all__ = ["reap"]


def reap(
    ledger: Ledger,
    keys: RunKeys,
    call_ids: Sequence[str],
    *,
    now_ms: int,
    min_rerun_ms: int,
    writer: str,
    redispatch: Callable[[RunKeys, str], None] | None,
    undispatched_after_ms: int | None = None,
    republish_after_ms: int | None = None,
) -> int:
    """Check ``call_ids`` of one run and act; returns how many calls were answered here.

    Without ``redispatch`` (nobody can send tasks) lost calls are answered ``worker_lost`` and
    lost messages wait for their deadline; with it, an unclaimed message is published again
    once it has waited ``republish_after_ms`` (None: never), then twice that, and so on.
    """
    snapshot = ledger.open_calls(keys, call_ids)
    actions = decide(
        snapshot,
        now_ms=now_ms,
        min_rerun_ms=min_rerun_ms,
        undispatched_after_ms=undispatched_after_ms,
        republish_after_ms=republish_after_ms if redispatch is not None else None,
    )
    by_id = {call.call_id: call for call in snapshot}
    answered = 0
    for action in actions:
        call = by_id[action.call_id]
        if redispatch is not None and action.kind is ActionKind.REQUEUE:
            if ledger.requeue(keys, call.call_id, expected_attempt=call.attempt, now_ms=now_ms):
                redispatch(keys, call.call_id)
            continue
        if redispatch is not None and action.kind is ActionKind.REPUBLISH:
            if ledger.count_republish(keys, call.call_id, expected=call.republishes, now_ms=now_ms):
                redispatch(keys, call.call_id)
            continue
        result = answer_open_call(call, action.reason or SyntheticReason.WORKER_LOST, now_ms=now_ms)
        answered += ledger.finish(keys, result, now_ms=now_ms, writer=writer)
    return answered
