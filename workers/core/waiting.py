"""Waiting for a batch of calls, as decisions without I/O: the sans-I/O shape of h11 and httpcore.

A driver (sync or asyncio, :mod:`workers.gateway.waiter`) asks :meth:`Waiting.step` what to do,
does that one piece of I/O, tells the machine what it read, and asks again, until the step is
:class:`Finish`. Every call is answered no later than its deadline plus the margin (half the
gateway's grace): from the ledger when it can be read, locally when the store is gone.

One round of the loop: store the answers prepared while the store was unreachable
(:class:`Store`), answer locally the calls past deadline + margin (:class:`AnswerLocally`), block
on the run's done list until the next check or the soonest deadline + margin (:class:`Block`),
and, when a check is due, check leases and deadlines (:class:`Check`, whose decisions are
:meth:`Waiting.reaps`). Before the first block, answers that came during submission are read
(:class:`Read`).

Reaping, what happens to a call that cannot be left alone (past its deadline, its worker or
message lost, never dispatched), is decided here too, by :func:`decide` and :func:`reaps`: for
the gateway's checks and for the watchdog's sweep, which the store applies (``Ledger.reap``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from workers.core.failure_policy import FallbackRule, delivered
from workers.core.models import CallState, SyntheticReason, ToolCall, ToolResult
from workers.core.results import deadline_result, synthetic_result

__all__ = [
    "Action",
    "ActionKind",
    "AnswerLocally",
    "Block",
    "Check",
    "DueVerdict",
    "Finish",
    "OpenCall",
    "Read",
    "Reap",
    "ReapRules",
    "Step",
    "Store",
    "Waiting",
    "answer_open_call",
    "decide",
    "next_look_ms",
    "past_first_look",
    "reaps",
]

# The shortest block: a deadline already reached still gets one short look at the done list.
_MIN_BLOCK_MS = 10
# The longest pause after the store failed, so that a store coming back is noticed soon.
_MAX_PAUSE_S = 0.2


# -- reaping: what happens to unanswered calls (the gateway's checks and the watchdog's) --------


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
    fallbacks: Mapping[str, FallbackRule],
    detail: str = "",
) -> ToolResult:
    """The answer to an unanswered call, as delivered: the one composition every writer uses.

    Past-deadline answers are :func:`~workers.core.results.deadline_result` (the same bytes
    whoever writes them); the others name the time since submission and the call's budget.
    ``fallbacks`` (``tools.fallbacks``) replace it with the tool's default where one covers
    ``reason`` (:func:`~workers.core.failure_policy.delivered`).
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
    return delivered(result, fallbacks)


# -- waiting: the steps of one wait on a batch ---------------------------------------------------


@dataclass(frozen=True)
class Read:
    """Read the results of ``call_ids`` once; a store error is ignored (the loop handles it)."""

    call_ids: list[str]


@dataclass(frozen=True)
class Store:
    """Store these answers prepared without a store (first writer wins), then read ``call_ids``.

    A store error leaves them prepared: they are answered locally once the margin passes.
    """

    results: list[ToolResult]

    @property
    def call_ids(self) -> list[str]:
        """The calls these answer."""
        return [result.tool_call_id for result in self.results]


@dataclass(frozen=True)
class AnswerLocally:
    """Past deadline + margin: store each result and deliver what the ledger then holds.

    When the store is unreachable each is delivered as it is and stored once Redis is back.
    """

    results: list[ToolResult]


@dataclass(frozen=True)
class Block:
    """Wait on the run's done list for ``call_ids``, at most ``timeout_s``."""

    call_ids: list[str]
    timeout_s: float


@dataclass(frozen=True)
class Check:
    """Lease and deadline checks: read the open calls, apply :meth:`Waiting.reaps`, read results."""

    call_ids: list[str]


@dataclass(frozen=True)
class Finish:
    """Every call has its answer: these are the ones this wait learned."""

    answers: dict[str, ToolResult]


Step = Read | Store | AnswerLocally | Block | Check | Finish


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


def reaps(
    snapshot: Iterable[OpenCall], rules: ReapRules, *, now_ms: int, fallbacks: Mapping[str, FallbackRule]
) -> list[Reap]:
    """What to do with the open calls of one run at ``now_ms``; answers come as delivered (``fallbacks``)."""
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
        answer = answer_open_call(call, reason, now_ms=now_ms, fallbacks=fallbacks)
        planned.append(Reap(call, ActionKind.ANSWER, answer))
    return planned


class _Phase(enum.Enum):
    STORE = "store"
    LOCAL = "local"
    BLOCK = "block"
    BLOCKED = "blocked"
    CHECK = "check"


@dataclass
class Waiting:
    """The decisions of one wait on a batch; a driver does the I/O each step names.

    ``deadlines``: call id -> deadline (ms) of every call waited for; ``answered`` those the
    batch has answers for already; ``prepared``: answers prepared while the store was
    unreachable; ``tools`` and ``submitted`` name each call's tool and submission (ms) for
    the deadline result; ``read_first``: the calls to read before the first block;
    ``fallbacks``: ``tools.fallbacks``, applied to what is answered locally or reaped.
    """

    deadlines: Mapping[str, int]
    margin_ms: int
    next_check_ms: int
    rules: ReapRules
    answered: frozenset[str] = frozenset()
    prepared: Mapping[str, ToolResult] = field(default_factory=dict)
    tools: Mapping[str, str] = field(default_factory=dict)
    submitted: Mapping[str, int] = field(default_factory=dict)
    read_first: Sequence[str] = ()
    fallbacks: Mapping[str, FallbackRule] = field(default_factory=dict)
    answers: dict[str, ToolResult] = field(default_factory=dict)
    _phase: _Phase = field(default=_Phase.STORE, init=False)
    _started: bool = field(default=False, init=False)

    @property
    def waiting(self) -> list[str]:
        """Call ids still without an answer, counting what this wait learned."""
        return [cid for cid in self.deadlines if cid not in self.answered and cid not in self.answers]

    def learn(self, answers: Mapping[str, ToolResult]) -> None:
        """Keep answers read from the ledger (or delivered locally)."""
        self.answers.update(answers)

    def step(self, now_ms: int) -> Step:
        """The next thing to do at ``now_ms``."""
        if not self._started:
            self._started = True
            earlier = [cid for cid in self.read_first if cid in self.waiting]
            if earlier:
                return Read(earlier)
        waiting = self.waiting
        if not waiting:
            return Finish(self.answers)
        if self._phase is _Phase.STORE:
            self._phase = _Phase.LOCAL
            pending = [self.prepared[cid] for cid in waiting if cid in self.prepared]
            if pending:
                return Store(pending)
        if self._phase is _Phase.LOCAL:
            self._phase = _Phase.BLOCK
            due = self._past_margin(now_ms)
            if due:
                return AnswerLocally(due)
            return self.step(now_ms)
        if self._phase is _Phase.BLOCK:
            self._phase = _Phase.BLOCKED
            until_ms = min(self.next_check_ms, self._soonest_ms())
            return Block(waiting, max(_MIN_BLOCK_MS, until_ms - now_ms) / 1000)
        if self._phase is _Phase.BLOCKED and now_ms >= self.next_check_ms:
            self._phase = _Phase.CHECK
            return Check(waiting)
        self._phase = _Phase.STORE
        return self.step(now_ms)

    def reaps(self, snapshot: Iterable[OpenCall], *, now_ms: int) -> list[Reap]:
        """What a :class:`Check` applies to the open calls read."""
        return reaps(snapshot, self.rules, now_ms=now_ms, fallbacks=self.fallbacks)

    def checked(self, next_check_ms: int) -> None:
        """A :class:`Check` is done; the next one is due at ``next_check_ms``."""
        self.next_check_ms = next_check_ms
        self._phase = _Phase.STORE

    def unreachable(self, now_ms: int) -> float:
        """The store failed a :class:`Block` or :class:`Check`: seconds to pause before the next step."""
        self._phase = _Phase.STORE
        return min(_MAX_PAUSE_S, max(0.0, (self._soonest_ms() - now_ms) / 1000))

    def _soonest_ms(self) -> int:
        return min(self.deadlines[cid] for cid in self.waiting) + self.margin_ms

    def _past_margin(self, now_ms: int) -> list[ToolResult]:
        """Answers for the calls past deadline + margin: what any writer stores by then.

        The answer prepared without a store, else the canonical deadline result, as delivered.
        """
        due = []
        for call_id in self.waiting:
            deadline_ms = self.deadlines[call_id]
            if now_ms < deadline_ms + self.margin_ms:
                continue
            call = ToolCall(id=call_id, name=self.tools.get(call_id) or "unknown")
            submitted_ms = self.submitted.get(call_id, deadline_ms)
            prepared = self.prepared.get(call_id) or deadline_result(
                call, submitted_ms=submitted_ms, deadline_ms=deadline_ms
            )
            due.append(delivered(prepared, self.fallbacks))
        return due
