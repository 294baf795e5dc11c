"""The one service that answers calls: fallbacks applied, first writer wins, the kept answer returned.

Every writer of a call's one result (gateway, dispatcher, waiter, canceller, watchdog, worker,
a run's end, the HTTP and MCP doors) hands its answer to :class:`Answers`, which applies the
tool's fallback (:mod:`workers.answering.rules`), writes it through the ledger (first writer
wins) and, when another writer won, reads back and returns the answer the ledger kept.

Each operation is written once, as a plan: a generator that names the ledger method it needs
next and gets its reply. :meth:`Plan.on` runs a plan on the sync ledger and
:meth:`Plan.on_async` on the asyncio one, both through the one driver written in
:mod:`workers.store._async.ledger_client` (``run_plan``), so the two paths send the same
commands.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, ParamSpec, TypeVar

from workers.answering.rules import FallbackLookup, delivered
from workers.core.failure_policy import FallbackRule
from workers.core.models import CallState, SyntheticReason, ToolResult
from workers.core.reaping import OpenCall, Reap, answer_open_call
from workers.errors import StoreError
from workers.store._async.ledger_client import run_plan as arun_plan
from workers.store._sync.ledger_client import run_plan
from workers.store.keys import RunKeys
from workers.store.ledger import AsyncLedger, Ledger, Registration
from workers.store.records import CallField

__all__ = ["Answered", "Answers", "Plan"]

T = TypeVar("T")
P = ParamSpec("P")

_Step = tuple[str, tuple[Any, ...], dict[str, Any]]
_Steps = Generator[_Step, Any, T]

_OPEN_CALLS_PAGE = 500  # calls per ledger_open.lua script when answering a run's open calls


def _ask(method: str, *args: Any, **kwargs: Any) -> _Step:
    """One ledger call a plan needs: the method's name and its arguments."""
    return method, args, kwargs


def _plan(method: Callable[P, _Steps[T]]) -> Callable[P, Plan[T]]:
    """A generator method, returned as a :class:`Plan` for the caller to run on its ledger."""

    @functools.wraps(method)
    def planned(*args: P.args, **kwargs: P.kwargs) -> Plan[T]:
        return Plan(method(*args, **kwargs))

    return planned


class Plan(Generic[T]):
    """One answering operation, run on either ledger; each step is one ledger method call."""

    def __init__(self, steps: _Steps[T]) -> None:
        self.steps = steps  # another plan runs it inside its own with ``yield from plan.steps``

    def on(self, ledger: Ledger) -> T:
        """Run on the sync ledger; a ``StoreError`` the plan does not handle is raised."""
        return run_plan(self.steps, ledger)

    async def on_async(self, ledger: AsyncLedger) -> T:
        """Run on the asyncio ledger: the same steps, each awaited where the ledger's method is async."""
        return await arun_plan(self.steps, ledger)


@dataclass(frozen=True)
class Answered:
    """A call's one answer after a write: ``result`` is what the ledger keeps, ``won`` whether it was ours."""

    result: ToolResult
    won: bool


@dataclass(frozen=True)
class Immediate:
    """A call answered without running (:meth:`Answers.record_immediate`): the registration and its answer."""

    registration: Registration
    result: ToolResult


class Answers:
    """Answers calls for one writer (``writer``: who the ledger names as the answer's author).

    ``fallbacks``: ``tools.fallbacks``; ``declared``: the fallbacks the tools declare, where
    they run (the worker); see :func:`workers.answering.rules.delivered`. Each method returns
    a :class:`Plan`: run it on the caller's ledger (``.on(ledger)``, ``await .on_async(ledger)``).
    """

    def __init__(
        self,
        *,
        writer: str,
        fallbacks: Mapping[str, FallbackRule],
        declared: FallbackLookup | None = None,
    ) -> None:
        self.writer = writer
        self._fallbacks = fallbacks
        self._declared = declared

    def given(self, result: ToolResult) -> ToolResult:
        """What the agent is given for ``result`` (its fallback, if one covers it): what is written."""
        return delivered(result, self._fallbacks, self._declared)

    # -- one answer ------------------------------------------------------------------------------

    @_plan
    def offer(
        self,
        keys: RunKeys,
        result: ToolResult,
        *,
        now_ms: int,
        writer: str | None = None,
        submitted_ms: int | None = None,
    ) -> _Steps[bool]:
        """Write ``result`` as given, first writer wins; True when it won (a loser is kept as late)."""
        given = self.given(result)
        won = yield _ask(
            "finish", keys, given, now_ms=now_ms, writer=writer or self.writer, submitted_ms=submitted_ms
        )
        return bool(won)

    @_plan
    def answer(
        self,
        keys: RunKeys,
        result: ToolResult,
        *,
        now_ms: int,
        writer: str | None = None,
        submitted_ms: int | None = None,
    ) -> _Steps[Answered]:
        """:meth:`offer`; when another writer was first, read back the kept answer."""
        given = self.given(result)
        offered = self.offer(keys, given, now_ms=now_ms, writer=writer, submitted_ms=submitted_ms)
        if (yield from offered.steps):
            return Answered(given, won=True)
        kept: dict[str, ToolResult] = yield _ask("results", keys, [given.tool_call_id])
        return Answered(kept.get(given.tool_call_id, given), won=False)

    @_plan
    def hand_on(
        self,
        keys: RunKeys,
        result: ToolResult,
        *,
        now_ms: int,
        store_later: Callable[[RunKeys, ToolResult], None] | None = None,
    ) -> _Steps[ToolResult]:
        """The call's one answer for an agent waiting now: :meth:`answer`, never failing on the store.

        Won: handed on as written (kept until a replica holds it, docs/failover.md). The store
        unreachable: handed on as given, and given to ``store_later`` to write once it is back.
        """
        given = self.given(result)
        try:
            answered = yield from self.answer(keys, given, now_ms=now_ms).steps
            if answered.won:
                yield _ask("handed", keys, {given.tool_call_id: given})
        except StoreError:
            if store_later is not None:
                store_later(keys, given)
            return given
        return answered.result

    # -- answers decided elsewhere ---------------------------------------------------------------

    @_plan
    def record_immediate(
        self, keys: RunKeys, result: ToolResult, *, now_ms: int, fields: dict[str, str]
    ) -> _Steps[Immediate]:
        """Register and answer a call that never runs (refused at admission, a loop block).

        A call id known already keeps the ledger's answer; a run that refuses new calls is the
        caller's to answer (``registration.refused``).
        """
        given, call_id = self.given(result), result.tool_call_id
        registration: Registration = yield _ask(
            "register_call", keys, call_id, now_ms=now_ms, deadline_ms=now_ms, fields=fields
        )
        if registration.created:
            yield from self.offer(keys, given, now_ms=now_ms).steps
            return Immediate(registration, given)
        if registration.refused and given.reason != SyntheticReason.RUN_ABORTED.value:
            return Immediate(registration, given)  # the caller answers it for the run's end
        kept: dict[str, ToolResult] = yield _ask("results", keys, [call_id])
        return Immediate(registration, kept.get(call_id, given))

    @_plan
    def reap(self, keys: RunKeys, reaps: Sequence[Reap], *, now_ms: int) -> _Steps[tuple[int, list[str]]]:
        """Apply reaping's decisions (:mod:`workers.core.reaping`): answers as given, the rest sent again.

        Returns how many were answered here and the ids of the calls whose task the caller sends again.
        """
        given = [r if r.answer is None else replace(r, answer=self.given(r.answer)) for r in reaps]
        reply: tuple[int, list[str]] = yield _ask("reap", keys, given, now_ms=now_ms, writer=self.writer)
        return reply

    @_plan
    def cancel(
        self,
        keys: RunKeys,
        call_ids: Sequence[str],
        *,
        now_ms: int,
        detail: str,
        on_answering: Callable[[OpenCall], None] | None = None,
    ) -> _Steps[list[OpenCall]]:
        """Answer ``cancelled`` those of ``call_ids`` no worker holds (the caller marked them first).

        A call claimed since its mark is left to its worker, which sees the mark and answers
        with the tool's partial output. ``on_answering`` is told of each call before its write.
        """
        found: list[OpenCall] = yield _ask("open_calls", keys, call_ids)
        idle = [call for call in found if call.state is not CallState.RUNNING]
        cancelled = SyntheticReason.CANCELLED
        return (yield from self._open_calls(keys, idle, cancelled, now_ms, detail, on_answering))

    @_plan
    def end_run(
        self, keys: RunKeys, reason: SyntheticReason, *, now_ms: int, detail: str
    ) -> _Steps[list[tuple[str, str]]]:
        """A run's end: answer every unanswered call of the run; returns (call id, task id) answered here."""
        call_ids: list[str] = yield _ask("run_call_ids", keys)
        calls: list[OpenCall] = []
        for start in range(0, len(call_ids), _OPEN_CALLS_PAGE):
            # In pages: one script over thousands of calls would block Redis too long.
            calls += yield _ask("open_calls", keys, call_ids[start : start + _OPEN_CALLS_PAGE])
        answered = yield from self._open_calls(keys, calls, reason, now_ms, detail, None)
        tasks = []
        for call in answered:
            record = yield _ask("record", keys, call.call_id)
            tasks.append((call.call_id, record.row.text(CallField.TASK_ID) if record else ""))
        return tasks

    def _open_calls(
        self,
        keys: RunKeys,
        calls: Sequence[OpenCall],
        reason: SyntheticReason,
        now_ms: int,
        detail: str,
        on_answering: Callable[[OpenCall], None] | None,
    ) -> _Steps[list[OpenCall]]:
        answered = []
        for call in calls:
            result = answer_open_call(call, reason, now_ms=now_ms, detail=detail)
            if on_answering is not None:
                on_answering(call)
            if (yield from self.offer(keys, result, now_ms=now_ms).steps):
                answered.append(call)
        return answered
