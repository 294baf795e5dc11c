"""What the gateway's call path carries: a batch of one run's calls, a call in flight, an abort.

Shared by both drivers of the path (sync and asyncio, :mod:`workers.gateway.call_path` and
the modules generated from ``workers/gateway/_async``); only the call path changes a batch,
a waiter only reads it and returns what it learned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from workers.core.loops import LoopVerdict, PendingCall
from workers.core.models import ToolCall, ToolResult
from workers.core.reaping import OpenCall
from workers.store.keys import RunKeys
from workers.store.sessions import RunAbort

__all__ = ["Abort", "Batch", "InFlight"]


@dataclass(frozen=True)
class Abort:
    """This run is aborted, and why: the one representation on the call's path.

    ``recorded``: the store already holds it (read from the run, or the run refused a call);
    otherwise it was decided in this batch and the gateway records it when concluding.
    """

    detector: str
    count: int
    message: str
    recorded: bool

    @classmethod
    def found(cls, record: RunAbort) -> Abort:
        """An abort the store already holds."""
        return cls(record.detector, record.count, record.message, recorded=True)

    @classmethod
    def decided(cls, verdict: LoopVerdict) -> Abort:
        """An abort the loop detector decided in this batch, not yet recorded."""
        detector = verdict.detector.value if verdict.detector else "loop"
        return cls(detector, verdict.count, verdict.message, recorded=False)

    @property
    def record(self) -> RunAbort:
        """The abort as the run record stores it."""
        return RunAbort(self.detector, self.count, self.message)


@dataclass
class Batch:
    """Calls of one run being waited for: call id -> deadline (ms), plus answers so far.

    Owned by the gateway: only its call path changes it (a waiter returns what it learned).
    """

    keys: RunKeys
    agent_id: str = "main"
    deadlines: dict[str, int] = field(default_factory=dict)
    pending_loops: dict[str, PendingCall] = field(default_factory=dict)
    # Calls of an agent without loop detection: judged (hashed) only if a compaction guard
    # turns out armed and their outcomes must be recorded.
    unjudged: dict[str, ToolCall] = field(default_factory=dict)
    abort: Abort | None = None
    run_deadline_ms: int | None = None
    guard_armed: bool = False
    tools: dict[str, str] = field(default_factory=dict)
    submitted: dict[str, int] = field(default_factory=dict)
    # The call registered (new) by the batch's last store round trip, if that was the last one:
    # no worker can have answered it before the first block (see the waiter's first reads).
    registered_last: str | None = None
    answers: dict[str, ToolResult] = field(default_factory=dict)
    # Answers prepared while the store was unreachable: stored (first writer wins) as soon as
    # it answers, and what the ledger then holds is delivered.
    fallbacks: dict[str, ToolResult] = field(default_factory=dict)

    @classmethod
    def collected(
        cls,
        keys: RunKeys,
        call_ids: Sequence[str],
        answers: Mapping[str, ToolResult],
        open_calls: Sequence[OpenCall],
    ) -> Batch:
        """The batch ``collect`` waits on: every call of the run, answered or still open."""
        batch = cls(keys)
        batch.answers.update(answers)
        for call in open_calls:
            batch.deadlines[call.call_id] = call.deadline_ms
            batch.submitted[call.call_id] = call.submitted_ms
            batch.tools[call.call_id] = call.tool
        for call_id in call_ids:
            batch.deadlines.setdefault(call_id, 0)
        return batch

    @property
    def waiting(self) -> list[str]:
        """Call ids still without an answer."""
        return [cid for cid in self.deadlines if cid not in self.answers]

    def note_abort(self, abort: Abort | None) -> None:
        """The one place the batch learns its run is aborted: the first reason stays.

        An abort the store already holds wins over one decided here (that one is not recorded).
        """
        if abort is None:
            return
        if self.abort is None or (abort.recorded and not self.abort.recorded):
            self.abort = abort


@dataclass
class InFlight:
    """One call on its way through the stages, and what the earlier stages learned about it."""

    call: ToolCall
    now_ms: int
    verdict: LoopVerdict | None = None
    # Its tool, policy and arguments were checked already (a submitter that registers itself
    # checks the whole batch first): admission does not validate it again.
    validated: bool = False
