"""The watchdog's sweep over unanswered calls, across all runs."""

from __future__ import annotations

from collections import defaultdict

from workers.answering.service import Answers
from workers.core.reaping import ReapRules, reaps
from workers.settings import Settings
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger
from workers.store.sweep_probe import probe_due_calls

__all__ = ["sweep_due_calls"]


def sweep_due_calls(
    ledger: Ledger,
    *,
    now_ms: int,
    settings: Settings,
    writer: str,
    limit: int = 10_000,
) -> int:
    """Answer overdue and lost calls; returns how many were answered.

    Candidates come by score: overdue calls and first looks from the due index (by deadline,
    or one lease after submission), lost workers from the lease index (by lease expiry as
    last renewed). Each is checked against its record and lease key (one pipelined read).
    Only the runs with an overdue, lost or never-dispatched call are then read in full and
    reaped.
    """
    lease_ms = int(settings.lease.ttl_s * 1000)
    found = probe_due_calls(ledger, now_ms=now_ms, lease_ms=lease_ms, limit=limit)
    runs: dict[RunKeys, list[str]] = defaultdict(list)
    for keys, call_id in found:
        runs[keys].append(call_id)
    # The watchdog sends no tasks: a lost call is answered, a lost message waits for its deadline.
    rules = ReapRules(min_rerun_ms=lease_ms, can_redispatch=False, undispatched_after_ms=lease_ms)
    answers = Answers(writer=writer, fallbacks=settings.tools.failure_rules().fallbacks)
    answered = 0
    for keys, call_ids in runs.items():
        planned = reaps(ledger.open_calls(keys, call_ids), rules, now_ms=now_ms)
        answered += answers.reap(keys, planned, now_ms=now_ms).on(ledger)[0]
    return answered
