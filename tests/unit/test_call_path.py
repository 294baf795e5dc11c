"""The gateway's call path: the stages' order, the first answering stage ends it, one abort value."""

from __future__ import annotations

from workers.core.loops import Detector, LoopVerdict
from workers.core.models import ToolCall, ToolResult
from workers.core.results import success_result
from workers.gateway._sync.waiter import Waiter
from workers.gateway.batch import Abort, Batch
from workers.gateway.call_path import CallPath, InFlight, Stage
from workers.settings import Settings
from workers.store.keys import RunKeys
from workers.store.sessions import RunAbort


def _batch() -> Batch:
    return Batch(RunKeys("t", "s", "r1"))


def test_stages_run_in_the_declared_order() -> None:
    assert CallPath.STAGES == (
        "skip_known",
        "refuse_aborted_run",
        "check_loops",
        "admit",
        "register_and_dispatch",
    )
    assert all(callable(getattr(CallPath, name)) for name in CallPath.STAGES)


def test_the_first_stage_that_answers_ends_the_call_path() -> None:
    # Given a path whose second stage answers every call
    seen: list[str] = []

    def stage(name: str, answers: bool) -> Stage:
        def run(batch: Batch, in_flight: InFlight) -> bool:
            seen.append(f"{name}:{in_flight.call.id}")
            return answers

        return run

    path = CallPath.__new__(CallPath)
    path.stages = (stage("a", False), stage("b", True), stage("c", False))
    # When a call is submitted
    path.submit(_batch(), ToolCall(id="c1", name="echo"))
    # Then the later stages never see it
    assert seen == ["a:c1", "b:c1"]


def test_a_recorded_abort_wins_over_one_decided_in_the_batch() -> None:
    batch = _batch()
    decided = Abort.decided(
        LoopVerdict(detector=Detector.PING_PONG, blocked=True, abort_run=True, count=4, message="loop")
    )
    batch.note_abort(decided)
    assert batch.abort == decided
    assert not decided.recorded
    assert decided.detector == "ping_pong"
    found = Abort.found(RunAbort("ping_pong", 6, "again"))
    batch.note_abort(found)
    assert batch.abort == found
    # ... and, once set, a later reason does not replace the first
    batch.note_abort(Abort.found(RunAbort("other", 1, "later")))
    batch.note_abort(None)
    assert batch.abort == found
    assert found.record == RunAbort("ping_pong", 6, "again")


def test_the_waiter_leaves_the_batch_alone() -> None:
    batch = _batch()
    batch.deadlines.update({"c1": 60_000, "c2": 60_000})
    batch.answers["c1"] = batch_result("c1")
    answers = _waiter(_ReadsLedger()).wait(batch)
    assert set(answers) == {"c2"}
    assert batch.waiting == ["c2"]  # the gateway applies what the waiter returns


def batch_result(call_id: str) -> ToolResult:
    return success_result(ToolCall(id=call_id, name="echo"), "ok", elapsed_ms=1, attempt=1)


class _ReadsLedger:
    """Just what Waiter.wait uses of a ledger: every wait is answered at once; reads are noted."""

    def __init__(self) -> None:
        self.reads: list[list[str]] = []

    def results(self, keys: RunKeys, call_ids: list[str]) -> dict[str, ToolResult]:
        self.reads.append(list(call_ids))
        return {}

    def wait_for_results(
        self, keys: RunKeys, timeout_s: float, *, mine: frozenset[str], read: list[str]
    ) -> dict[str, ToolResult]:
        return {
            cid: success_result(ToolCall(id=cid, name="echo"), "ok", elapsed_ms=1, attempt=1) for cid in read
        }


def _waiter(ledger: _ReadsLedger) -> Waiter:
    return Waiter(
        ledger,  # type: ignore[arg-type]  # a stand-in with what wait() uses here
        Settings(),
        "gw",
        now_ms=lambda: 1_000,
        sleep=lambda _: None,
        redispatch=lambda keys, call_id: None,
    )


def _reads_before_blocking(call_ids: list[str], registered_last: str | None) -> list[list[str]]:
    ledger = _ReadsLedger()
    waiter = _waiter(ledger)
    batch = _batch()
    for call_id in call_ids:
        batch.deadlines[call_id] = 60_000
    batch.registered_last = registered_last
    assert set(waiter.wait(batch)) == set(call_ids)
    return ledger.reads


def test_a_batch_of_one_new_call_blocks_without_reading_first() -> None:
    # Registered by the batch's last round trip: nothing can have answered it yet
    assert _reads_before_blocking(["c1"], registered_last="c1") == []


def test_calls_registered_before_the_last_one_are_read_before_blocking() -> None:
    # The first call may have been answered (its signal taken by another waiter) meanwhile
    assert _reads_before_blocking(["c1", "c2"], registered_last="c2") == [["c1"]]


def test_a_batch_not_just_registered_reads_all_its_calls_first() -> None:
    # collect, or a resubmission of calls already registered
    assert _reads_before_blocking(["c1", "c2"], registered_last=None) == [["c1", "c2"]]


class _FinishingLedger(_ReadsLedger):
    """A ledger whose ``finish`` wins or loses as told; reads are noted."""

    def __init__(self, wins: bool) -> None:
        super().__init__()
        self.wins = wins
        self.finished: list[str] = []

    def finish(
        self, keys: RunKeys, result: ToolResult, *, now_ms: int, writer: str, submitted_ms: int | None = None
    ) -> bool:
        self.finished.append(result.tool_call_id)
        return self.wins

    def handed(self, keys: RunKeys, answers: dict[str, ToolResult]) -> dict[str, ToolResult]:
        self.handed_on = [*getattr(self, "handed_on", []), *answers]
        return answers


def _answered_locally(wins: bool) -> tuple[ToolResult, _FinishingLedger]:
    ledger = _FinishingLedger(wins)
    batch = _batch()
    batch.deadlines["c1"] = -60_000  # long past deadline + margin at 1_000
    answers = _waiter(ledger).wait(batch)
    return answers["c1"], ledger


def test_a_call_answered_locally_is_read_back_only_when_another_writer_won() -> None:
    # Given a call past its deadline plus the margin, answered locally with the deadline result
    result, ledger = _answered_locally(wins=True)
    assert result.reason == "deadline_exceeded"
    assert ledger.finished == ["c1"]
    # When it won: what it stored is what the ledger holds, nothing more to read
    assert ledger.reads == [["c1"]]  # the one read before the first step (not just registered)
    # and it is handed on as stored: kept until a replica holds it (docs/failover.md)
    assert ledger.handed_on == ["c1"]
    # When another writer won: the ledger's answer is read and delivered
    _, lost = _answered_locally(wins=False)
    assert lost.reads == [["c1"], ["c1"]]
