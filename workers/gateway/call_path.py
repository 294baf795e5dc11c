"""A tool call's path through the gateway, as one pipeline of named stages.

A batch opens its run, then each call passes through :data:`CallPath.stages` in order; a stage
either answers the call (one result, recorded once through :meth:`CallPath.answer_now`) or
passes it on. The batch is then waited on (the waiter returns what it learned; the gateway
applies it) and concluded: loop and breaker outcomes recorded, the results in call order,
or the run's abort raised with them. Whether and why the run is aborted is one value,
``Batch.abort``, set only through ``Batch.note_abort``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from workers.core.models import SyntheticReason, ToolCall, ToolResult
from workers.core.results import synthetic_result
from workers.core.run_health import RunStatus
from workers.errors import RedisRefused, StoreError
from workers.gateway._sync.registering import Registering
from workers.gateway.batch import Abort, Batch, InFlight
from workers.gateway.breaker import BreakerGate
from workers.gateway.dispatching import Dispatcher, Submission
from workers.gateway.loop_abort import abort_run
from workers.gateway.loop_gate import LoopGate
from workers.settings import Settings
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger, Registration
from workers.store.sessions import SessionStore, run_abort

__all__ = ["CallPath", "InFlight", "Stage"]

log = logging.getLogger(__name__)

_RUN_CACHE_SIZE = 4096


def _now(function: Callable[..., None], *args: Any) -> None:
    """Run a step of registration at once (the sync path has no loop to keep free)."""
    function(*args)


Stage = Callable[[Batch, InFlight], bool]
"""A step of the path: True when it answered the call (or the batch has it already): stop."""


class CallPath:
    """Admits, registers and dispatches a batch's calls, then concludes it."""

    # The order a call meets the stages in. The loop gate sees a call before validation, so
    # a model repeating a rejected call is caught like any other repetition.
    STAGES = ("skip_known", "refuse_aborted_run", "check_loops", "admit", "register_and_dispatch")

    def __init__(
        self,
        settings: Settings,
        ledger: Ledger,
        sessions: SessionStore,
        dispatcher: Dispatcher,
        loops: LoopGate,
        breakers: BreakerGate | None,
        *,
        writer: str,
        now_ms: Callable[[], int],
    ) -> None:
        self.settings = settings
        self._ledger = ledger
        self._sessions = sessions
        self._dispatcher = dispatcher
        self._loops = loops
        self._breakers = breakers
        self._writer = writer
        self._now_ms = now_ms
        self._run_deadlines: dict[tuple[str, str], int] = {}
        # Fixed per agent by the settings: asked once, not on every call.
        self._detects = cache(loops.detects)
        self._run_timeout_ms = cache(self._agent_run_timeout_ms)
        self.stages: tuple[Stage, ...] = tuple(getattr(self, name) for name in self.STAGES)
        self._registering = Registering(self, dispatcher, ledger, _now)

    # -- the batch ---------------------------------------------------------------------------

    def submit_all(self, keys: RunKeys, agent_id: str, calls: Sequence[ToolCall]) -> Batch:
        """Open the run and pass every call through the stages; the batch to wait on."""
        batch = Batch(keys, agent_id)
        self.open_run(batch)
        for call in calls:
            self.submit(batch, call)
        return batch

    def submit(self, batch: Batch, call: ToolCall) -> None:
        """Pass ``call`` through the stages until one answers it (or it is dispatched)."""
        in_flight = InFlight(call, now_ms=0)
        batch.registered_last = None  # this call's stages come after any earlier registration
        for stage in self.stages:
            if stage(batch, in_flight):
                return

    def reaches_registration(self, batch: Batch, call: ToolCall, *, validated: bool) -> InFlight | None:
        """Pass ``call`` through the stages before registration (for a submitter that registers itself).

        The call to register, or None when an earlier stage answered it. ``validated``: the
        submitter checked the call already (:meth:`storeless_until_registration`).
        """
        in_flight = InFlight(call, now_ms=0, validated=validated)
        early = self.stages[:-1]
        return None if any(stage(batch, in_flight) for stage in early) else in_flight

    def storeless_until_registration(self, agent_id: str, calls: Sequence[ToolCall]) -> bool:
        """Whether the stages before registration use no store for ``calls`` of a cached run.

        True without loop detection for ``agent_id``, without circuit breakers and when no
        call is refused at admission (a refusal is recorded in the store at once).
        """
        if self.settings.tools.breakers or self._detects(agent_id):
            return False
        return all(self._dispatcher.reject_early(call, agent_id) is None for call in calls)

    def needs_store(self, batch: Batch) -> bool:
        """Whether :meth:`conclude` writes to the store (loop or breaker outcomes, an abort)."""
        if batch.abort is not None or self.settings.tools.breakers:
            return True
        return bool(batch.pending_loops or batch.unjudged) and self._needs_outcomes(batch)

    def conclude(self, batch: Batch, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Record loop and breaker outcomes; the results in call order, or the abort raised with them."""
        self._record_loop_outcomes(batch)
        if self._breakers is not None:
            self._breakers.record(batch.keys, batch.answers)
        results = [batch.answers[call.id] for call in calls]
        if batch.abort is not None:
            raise abort_run(
                self._sessions, self._dispatcher.answers, batch.keys, batch.abort, results, self._now_ms
            )
        return results

    # -- the stages, in order ----------------------------------------------------------------

    def skip_known(self, batch: Batch, in_flight: InFlight) -> bool:
        """A call id listed twice in a batch is answered once."""
        return in_flight.call.id in batch.deadlines

    def refuse_aborted_run(self, batch: Batch, in_flight: InFlight) -> bool:
        """A run found aborted when opened answers its calls ``run_aborted`` at once."""
        abort = batch.abort
        if abort is None or not abort.recorded:
            return False
        detail = f" by the loop detector ({abort.detector})"
        result = synthetic_result(
            in_flight.call, SyntheticReason.RUN_ABORTED, elapsed_ms=0, attempt=0, detail=detail
        )
        self.answer_now(batch, in_flight.call, result)
        return True

    def check_loops(self, batch: Batch, in_flight: InFlight) -> bool:
        """The loop gate: a blocked call is answered (and may abort the run)."""
        call = in_flight.call
        in_flight.now_ms = self._now_ms()
        batch.tools[call.id] = call.name
        if not self._detects(batch.agent_id):
            batch.unjudged[call.id] = call
            return False
        keys = batch.keys
        try:
            pending = self._loops.before(
                keys.session_key, keys.run_id, batch.agent_id, call, in_flight.now_ms
            )
        except StoreError as exc:
            # Detection must never make a call unanswerable: without the store, it steps aside.
            log.warning("loop check skipped for %s: %s", call.id, exc)
            return False
        in_flight.verdict = verdict = pending.verdict
        if not verdict.blocked:
            batch.pending_loops[call.id] = pending
            return False
        self.answer_now(batch, call, self._loops.blocked_result(call, verdict))
        if verdict.abort_run:
            batch.note_abort(Abort.decided(verdict))
        return True

    def admit(self, batch: Batch, in_flight: InFlight) -> bool:
        """Validation (tool, policy, arguments) and the tool's circuit breaker."""
        call = in_flight.call
        early = None if in_flight.validated else self._dispatcher.reject_early(call, batch.agent_id)
        if early is None and self._breakers is not None:
            early = self._breakers.admit(batch.keys, call)
        if early is None:
            return False
        self.answer_now(batch, call, early)
        return True

    def register_and_dispatch(self, batch: Batch, in_flight: InFlight) -> bool:
        """Register the call in the ledger and publish it; the waiter takes it from here."""
        self._registering.register(batch, in_flight)
        return True

    def plan(self, batch: Batch, in_flight: InFlight) -> Submission:
        """The call's registration (its limits, record and message), its deadline noted in the batch."""
        call = in_flight.call
        submission = self._dispatcher.plan(
            batch.keys,
            batch.agent_id,
            call,
            in_flight.now_ms,
            batch.run_deadline_ms,
            # Shown in Flower with the task.
            loop_warning=None if in_flight.verdict is None else self._loops.warning_of(in_flight.verdict),
        )
        batch.deadlines[call.id] = submission.job.deadline_ms
        batch.submitted[call.id] = submission.job.submitted_ms
        return submission

    def registered(self, batch: Batch, submission: Submission, registration: Registration) -> None:
        """What the register script said, for the batch (a refusal reads the run's abort: store I/O)."""
        batch.guard_armed = batch.guard_armed or registration.guard_armed
        if registration.refused:
            self._refuse(batch, submission.job.call, registration.run_status)

    def unregistered(self, batch: Batch, submission: Submission, exc: StoreError) -> None:
        """A call the store did not take: answered ``dispatch_failed`` by the waiter."""
        call = submission.job.call
        log.warning("store unavailable while submitting %s: %s", call.id, exc)
        # Stored by the waiter as soon as Redis answers (then the ledger's answer is
        # delivered), else handed over once the grace margin passes and stored later. A
        # registration Redis refused was not written: its margin runs from submission. One
        # whose reply never came (a timeout, a lost connection, too few replicas) may have
        # been written, and its message pushed: a worker may be answering it, so its margin
        # runs from the call's own deadline, and what is delivered is what the ledger holds
        # once it answers (a local answer handed over sooner would differ from the ledger).
        known_unwritten = isinstance(exc, RedisRefused)
        batch.deadlines[call.id] = (
            submission.job.submitted_ms if known_unwritten else submission.job.deadline_ms
        )
        result = synthetic_result(
            call,
            SyntheticReason.DISPATCH_FAILED,
            elapsed_ms=0,
            attempt=0,
            detail=" (result store unreachable)",
        )
        batch.fallbacks[call.id] = self._dispatcher.answers.given(result)

    # -- answering and the run ---------------------------------------------------------------

    def answer_now(self, batch: Batch, call: ToolCall, result: ToolResult) -> None:
        """Record a stage's answer once (with its fallback); the stored one wins for a resubmitted call id."""
        batch.tools[call.id] = call.name
        batch.deadlines[call.id] = self._now_ms()
        try:
            immediate = self._dispatcher.record_immediate(batch.keys, result)
        except StoreError as exc:
            log.warning("store unavailable while answering %s: %s", call.id, exc)
            # Answered by the waiter, stored first if it can.
            batch.fallbacks[call.id] = self._dispatcher.answers.given(result)
            return
        registration = immediate.registration
        batch.guard_armed = batch.guard_armed or registration.guard_armed
        if registration.refused and result.reason != SyntheticReason.RUN_ABORTED.value:
            # The run ended (a loop abort, a timeout, a newer run): that answer wins.
            self._refuse(batch, call, registration.run_status)
        else:
            batch.answers[call.id] = immediate.result

    def _refuse(self, batch: Batch, call: ToolCall, run_status: RunStatus) -> None:
        """Answer a call its run no longer accepts; a loop abort is raised to the caller later."""
        self.forget_run(batch.keys)
        try:
            record = run_abort(self._ledger, batch.keys)
        except StoreError:
            record = None
        if record is not None:
            batch.note_abort(Abort.found(record))
        detail = f" by the loop detector ({record.detector})" if record else f" (run {run_status})"
        result = synthetic_result(call, SyntheticReason.RUN_ABORTED, elapsed_ms=0, attempt=0, detail=detail)
        self.answer_now(batch, call, result)

    def _answer_superseded(self, now_ms: int) -> Callable[[RunKeys], object]:
        """How a run this batch's run supersedes gets its open calls answered: ``cancelled``, at once."""
        detail = " because a newer run of this session took over"
        answers = self._dispatcher.answers

        def answer(keys: RunKeys) -> object:
            return answers.end_run(keys, SyntheticReason.CANCELLED, now_ms=now_ms, detail=detail).on(
                self._ledger
            )

        return answer

    def ensure_run(self, keys: RunKeys, agent_id: str) -> None:
        """Create the run record on first use (a heartbeat before any call)."""
        self.open_run(Batch(keys, agent_id))

    def forget_run(self, keys: RunKeys) -> None:
        """Drop the cached deadline: the run ended, its next call must read the record."""
        self._run_deadlines.pop((keys.session_key, keys.run_id), None)

    def open_cached_run(self, batch: Batch) -> bool:
        """Take the run's deadline from the cache (no store access); False when not cached."""
        deadline_ms = self._run_deadlines.get((batch.keys.session_key, batch.keys.run_id))
        if deadline_ms is None:
            return False
        batch.run_deadline_ms = deadline_ms
        return True

    def open_run(self, batch: Batch) -> None:
        """Begin the run and read its state (``SessionStore.begin_and_open``) when first seen here.

        The deadline never changes once set, so it is cached; later aborts and an armed
        compaction guard are reported by each call's registration instead.
        """
        run = (batch.keys.session_key, batch.keys.run_id)
        if self.open_cached_run(batch):
            return
        now = self._now_ms()
        deadline_ms = now + self._run_timeout_ms(batch.agent_id)
        try:
            # Take the session's lane (superseding an older run of the session); a run that
            # already ended gets token 0, and its calls are then refused at registration.
            state = self._sessions.begin_and_open(
                *run, batch.agent_id, now, deadline_ms, answer_superseded=self._answer_superseded(now)
            )
        except StoreError as exc:
            log.warning("run record unavailable: %s", exc)
            return
        batch.run_deadline_ms = state.deadline_ms
        batch.guard_armed = state.guard_armed
        if state.abort is not None:
            batch.note_abort(Abort.found(state.abort))
            return
        if len(self._run_deadlines) >= _RUN_CACHE_SIZE:
            self._run_deadlines.pop(next(iter(self._run_deadlines)))
        self._run_deadlines[run] = state.deadline_ms

    def _agent_run_timeout_ms(self, agent_id: str) -> int:
        return int(self.settings.agents.for_agent(agent_id).run_timeout_s * 1000)

    def _needs_outcomes(self, batch: Batch) -> bool:
        """Whether loop outcomes are recorded: detection on, or a compaction guard armed."""
        return batch.guard_armed or self._detects(batch.agent_id)

    def _record_loop_outcomes(self, batch: Batch) -> None:
        if not self._needs_outcomes(batch):
            return  # detection off and no compaction guard armed: nothing to record
        keys = batch.keys
        for call_id, call in batch.unjudged.items():
            # Detection off: judging reads no history, it only hashes what the guard records.
            batch.pending_loops[call_id] = self._loops.before(
                keys.session_key, keys.run_id, batch.agent_id, call, self._now_ms()
            )
        for call_id, pending in batch.pending_loops.items():
            result = batch.answers[call_id]
            # The warning is for the model; the outcome is hashed without it.
            batch.answers[call_id] = self._loops.with_warning(result, pending.verdict)
            try:
                verdict = self._loops.after(batch.agent_id, pending, result, self._now_ms())
            except StoreError as exc:
                log.warning("loop outcome of %s not recorded: %s", call_id, exc)
                continue
            if verdict is not None:
                batch.note_abort(Abort.decided(verdict))
