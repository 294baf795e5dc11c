"""Reaping: what happens to a call that cannot be left alone, decided without I/O.

A call past its deadline, whose worker or message is lost, or that was never dispatched is
answered, re-run or sent again: :func:`decide` and :func:`reaps` decide it for the gateway's
checks (:mod:`workers.core.waiting`) and for the watchdog's sweep, and the store applies the
decisions (through :class:`workers.answering.service.Answers`, which applies the fallbacks).
:func:`answer_open_call` composes the raw answer every such writer starts from.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from workers.core.models import CallState, SyntheticReason, ToolCall, ToolResult
from workers.core.results import deadline_result, synthetic_result

__all__ = [
    "Action",
    "ActionKind",
    "DueVerdict",
    "OpenCall",
    "Reap",
    "ReapRules",
    "answer_open_call",
    "decide",
    "next_look_ms",
    "past_first_look",
    "reaps",
]


@dataclass(frozen=True)
class OpenCall:
    """What the ledger knows about one unanswered call."""

    call_id: str
    tool: str
    state: CallState
    deadline_ms: int
    attempt: int
    lease_alive: bool
    idempotent: bool
    dispatched: bool
    submitted_ms: int
    # When it last went into a queue (registration, requeue, republish); None: at submission.
    queued_ms: int | None = None
    republishes: int = 0  # times its message was published again, unclaimed (see decide)

    @property
    def waiting_in_queue(self) -> bool:
        """Published and not claimed by any worker since (pending, no lease)."""
        return self.state is CallState.PENDING and self.dispatched and not self.lease_alive

    def republish_due(self, now_ms: int, after_ms: int) -> bool:
        """Whether it has waited unclaimed ``after_ms`` doubled per earlier republish.

        The doubling keeps a real backlog (calls that wait in a queue longer than a lease
        because every worker is busy) from filling with copies: log2(wait / after) at most.
        """
        queued_ms = self.submitted_ms if self.queued_ms is None else self.queued_ms
        return self.waiting_in_queue and now_ms - queued_ms >= after_ms << min(self.republishes, 16)


class DueVerdict(enum.StrEnum):
    """What a sweep does with one member of the due or lease index, after reading its record and lease.

    The due index scores a call by its deadline, or by one lease after its submission when
    that comes first (:func:`next_look_ms`): the sweep's first look, which a call answered
    sooner (most) never gets. The lease index holds calls that may outlive their lease.
    """

    REAP = "reap"  # overdue, lost or never dispatched: decide() answers or requeues it
    DROP = "drop"  # record gone or answered: leave both indexes
    RESCORE = "rescore"  # its lease is alive: into the lease index by its end, due by its deadline
    UNHOLD = "unhold"  # pending in the queue: due by its deadline, out of the lease index
    KEEP = "keep"  # nothing to do yet


def next_look_ms(deadline_ms: int, submitted_ms: int, lease_ms: int) -> int:
    """A new call's due-index score: its deadline, or one lease after submission if sooner."""
    return min(deadline_ms, submitted_ms + lease_ms)


def past_first_look(*, now_ms: int, submitted_ms: int | None, lease_ms: int) -> bool:
    """Whether the sweep may have looked at a call submitted at ``submitted_ms`` by ``now_ms``.

    The first look comes one lease after submission (:func:`next_look_ms`); a call claimed
    before it needs no lease-index entry, since that look finds a running call and puts it
    in the lease index itself (by its lease's real end), and a call answered before it was
    never put there. A claim or answer later than that writes or removes the entry. Half a
    lease leaves room for clocks that disagree; ``submitted_ms`` None (unknown) counts as past.
    """
    return submitted_ms is None or now_ms - submitted_ms >= lease_ms // 2


class ActionKind(enum.Enum):
    """What to do with a call."""

    ANSWER = "answer"
    REQUEUE = "requeue"  # its worker is lost: make it pending again and publish it again
    REPUBLISH = "republish"  # its message is lost: publish the same message again


@dataclass(frozen=True)
class Action:
    """One decision: answer ``call_id`` with ``reason``, or hand it to another worker."""

    call_id: str
    kind: ActionKind
    reason: SyntheticReason | None
    elapsed_ms: int
    attempt: int


def _decide_one(
    call: OpenCall,
    now_ms: int,
    min_rerun_ms: int,
    undispatched_after_ms: int | None,
    republish_after_ms: int | None,
) -> Action | None:
    elapsed = max(0, now_ms - call.submitted_ms)
    if now_ms >= call.deadline_ms:
        return Action(
            call.call_id, ActionKind.ANSWER, SyntheticReason.DEADLINE_EXCEEDED, elapsed, call.attempt
        )
    if call.state is CallState.RUNNING and not call.lease_alive:
        if call.idempotent and call.deadline_ms - now_ms >= min_rerun_ms:
            return Action(call.call_id, ActionKind.REQUEUE, None, elapsed, call.attempt)
        return Action(call.call_id, ActionKind.ANSWER, SyntheticReason.WORKER_LOST, elapsed, call.attempt)
    if (
        undispatched_after_ms is not None
        and call.state is CallState.PENDING
        and not call.dispatched
        and elapsed >= undispatched_after_ms
    ):
        return Action(call.call_id, ActionKind.ANSWER, SyntheticReason.DISPATCH_FAILED, elapsed, call.attempt)
    if republish_after_ms is not None and call.republish_due(now_ms, republish_after_ms):
        return Action(call.call_id, ActionKind.REPUBLISH, None, elapsed, call.attempt)
    return None


def decide(
    calls: Iterable[OpenCall],
    *,
    now_ms: int,
    min_rerun_ms: int,
    undispatched_after_ms: int | None = None,
    republish_after_ms: int | None = None,
) -> list[Action]:
    """Actions for every call that cannot be left alone.

    * past its deadline → answered ``deadline_exceeded``;
    * running with its worker's lease expired → re-run elsewhere when the tool is idempotent
      and at least ``min_rerun_ms`` remain, else answered ``worker_lost``;
    * never handed to the broker (the gateway died in between) for ``undispatched_after_ms``
      → answered ``dispatch_failed``; ``None`` disables this rule for a live gateway;
    * published but claimed by no worker for ``republish_after_ms`` (doubled per earlier
      republish) → its message published again: a worker killed between taking a message and
      claiming its call loses the message, and nothing else would run the call before its
      deadline. Safe for any tool: a call is claimed once while pending, a second copy finds
      it running or answered and runs nothing. ``None`` (the watchdog, which publishes
      nothing) disables the rule.
    """
    actions = (
        _decide_one(call, now_ms, min_rerun_ms, undispatched_after_ms, republish_after_ms) for call in calls
    )
    return [action for action in actions if action is not None]


def answer_open_call(
    call: OpenCall,
    reason: SyntheticReason,
    *,
    now_ms: int,
    detail: str = "",
) -> ToolResult:
    """The answer to an unanswered call, before its fallback: the one composition every writer uses.

    Past-deadline answers are :func:`~workers.core.results.deadline_result` (the same bytes
    whoever writes them); the others name the time since submission and the call's budget.
    The answering service applies the tool's fallback when it writes it.
    """
    answered = ToolCall(id=call.call_id, name=call.tool or "unknown")
    if reason is SyntheticReason.DEADLINE_EXCEEDED:
        result = deadline_result(answered, submitted_ms=call.submitted_ms, deadline_ms=call.deadline_ms)
    else:
        result = synthetic_result(
            answered,
            reason,
            elapsed_ms=max(0, now_ms - call.submitted_ms),
            attempt=call.attempt,
            limit_s=max(0, call.deadline_ms - call.submitted_ms) / 1000,
            detail=detail,
        )
    return result


@dataclass(frozen=True)
class Reap:
    """One decision on an open call: store ``answer``, or hand ``call`` to a worker again.

    ``kind`` REQUEUE (its worker is lost) or REPUBLISH (its message is lost): once the ledger
    takes the change, its task is sent again.
    """

    call: OpenCall
    kind: ActionKind
    answer: ToolResult | None = None


@dataclass(frozen=True)
class ReapRules:
    """When an open call is reaped (see :func:`decide`).

    ``can_redispatch`` False (the watchdog, which sends no tasks): lost calls are answered
    ``worker_lost`` and lost messages wait for their deadline.
    """

    min_rerun_ms: int
    can_redispatch: bool = True
    undispatched_after_ms: int | None = None
    republish_after_ms: int | None = None


def reaps(snapshot: Iterable[OpenCall], rules: ReapRules, *, now_ms: int) -> list[Reap]:
    """What to do with the open calls of one run at ``now_ms``; answers come raw (no fallback yet)."""
    calls = list(snapshot)
    actions = decide(
        calls,
        now_ms=now_ms,
        min_rerun_ms=rules.min_rerun_ms,
        undispatched_after_ms=rules.undispatched_after_ms,
        republish_after_ms=rules.republish_after_ms if rules.can_redispatch else None,
    )
    by_id = {call.call_id: call for call in calls}
    planned = []
    for action in actions:
        call = by_id[action.call_id]
        if rules.can_redispatch and action.kind is not ActionKind.ANSWER:
            planned.append(Reap(call, action.kind))
            continue
        reason = action.reason or SyntheticReason.WORKER_LOST
        answer = answer_open_call(call, reason, now_ms=now_ms)
        planned.append(Reap(call, ActionKind.ANSWER, answer))
    return planned
