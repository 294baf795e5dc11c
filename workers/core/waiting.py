"""Waiting for a batch of calls, as decisions without I/O: the sans-I/O shape of h11 and httpcore.

A driver (:mod:`workers.gateway._async.waiter`, its sync side generated) asks
:meth:`Waiting.step` what to do, does that one piece of I/O, tells the machine what it read,
and asks again, until the step is :class:`Finish`. Every call is answered no later than its
deadline plus the margin (half the gateway's grace): from the ledger when it can be read,
locally when the store is gone.

One round of the loop: store the answers prepared while the store was unreachable
(:class:`Store`), answer locally the calls past deadline + margin (:class:`AnswerLocally`), block
on the run's done list until the next check or the soonest deadline + margin (:class:`Block`),
and, when a check is due, check leases and deadlines (:class:`Check`, whose decisions are
:meth:`Waiting.reaps`). Before the first block, answers that came during submission are read
(:class:`Read`).

A check's decisions are reaping's (:mod:`workers.core.reaping`), the same as the watchdog's.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from workers.core.models import ToolCall, ToolResult
from workers.core.reaping import OpenCall, Reap, ReapRules, reaps
from workers.core.results import deadline_result

__all__ = ["AnswerLocally", "Block", "Check", "Finish", "Read", "Step", "Store", "Waiting"]

# The shortest block: a deadline already reached still gets one short look at the done list.
_MIN_BLOCK_MS = 10
# The longest pause after the store failed, so that a store coming back is noticed soon.
_MAX_PAUSE_S = 0.2


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
    the deadline result; ``read_first``: the calls to read before the first block. Answers
    come raw: the answering service applies the fallbacks when it writes or hands them on.
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
        return reaps(snapshot, self.rules, now_ms=now_ms)

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

        The answer prepared without a store, else the canonical deadline result (no fallback yet).
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
            due.append(prepared)
        return due
