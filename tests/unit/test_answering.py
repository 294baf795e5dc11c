"""The answering service's rules on a recording fake ledger: fallbacks, first writer wins, kept answers."""

from __future__ import annotations

from typing import Any

import pytest

from workers.answering.service import Answers
from workers.core.failure_policy import FallbackRule
from workers.core.models import CallState, SyntheticReason, ToolCall, ToolResult
from workers.core.reaping import ActionKind, OpenCall, Reap
from workers.core.results import deadline_result, success_result, synthetic_result, tool_error_result
from workers.core.run_health import RunStatus
from workers.errors import StoreError
from workers.store.keys import RunKeys
from workers.store.ledger import Registration

KEYS = RunKeys("t", "s", "r1")
CALL = ToolCall(id="c1", name="fetch")
FALLBACKS = {"fetch": FallbackRule("cached")}


class FakeLedger:
    """Records each ledger call; ``wins`` says whether a finish is first, ``kept`` what a read returns."""

    def __init__(self, *, wins: bool = True, kept: ToolResult | None = None, fail: bool = False) -> None:
        self.wins, self.kept, self.fail = wins, kept, fail
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.registration = Registration(created=True, run_status=RunStatus.RUNNING, guard_armed=False)
        self.open: list[OpenCall] = []

    def _note(self, method: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((method, args, kwargs))
        if self.fail and method != "handed":
            raise StoreError("down")

    def finish(self, keys: RunKeys, result: ToolResult, **kwargs: Any) -> bool:
        self._note("finish", keys, result, **kwargs)
        return self.wins

    def results(self, keys: RunKeys, call_ids: list[str]) -> dict[str, ToolResult]:
        self._note("results", keys, call_ids)
        return {self.kept.tool_call_id: self.kept} if self.kept else {}

    def register_call(self, keys: RunKeys, call_id: str, **kwargs: Any) -> Registration:
        self._note("register_call", keys, call_id, **kwargs)
        return self.registration

    def reap(self, keys: RunKeys, reaps: list[Reap], **kwargs: Any) -> tuple[int, list[str]]:
        self._note("reap", keys, reaps, **kwargs)
        return sum(r.answer is not None for r in reaps), [r.call.call_id for r in reaps if r.answer is None]

    def open_calls(self, keys: RunKeys, call_ids: list[str]) -> list[OpenCall]:
        self._note("open_calls", keys, call_ids)
        return [call for call in self.open if call.call_id in call_ids]

    def handed(self, keys: RunKeys, answers: dict[str, ToolResult]) -> dict[str, ToolResult]:
        self._note("handed", keys, answers)
        return answers

    @property
    def methods(self) -> list[str]:
        return [method for method, _, _ in self.calls]


class AsyncFakeLedger(FakeLedger):
    """The same, awaited as the asyncio ledger is (``handed`` stays sync there too)."""

    async def finish(self, keys: RunKeys, result: ToolResult, **kwargs: Any) -> bool:  # type: ignore[override]
        return super().finish(keys, result, **kwargs)

    async def results(self, keys: RunKeys, call_ids: list[str]) -> dict[str, ToolResult]:  # type: ignore[override]
        return super().results(keys, call_ids)

    async def reap(self, keys: RunKeys, reaps: list[Reap], **kwargs: Any) -> tuple[int, list[str]]:  # type: ignore[override]
        return super().reap(keys, reaps, **kwargs)


def _fake(cls: type[FakeLedger], **kwargs: Any) -> Any:
    """A fake ledger, typed loosely: plans take it where they take a ledger."""
    return cls(**kwargs)


def _answers(**kwargs: Any) -> Answers:
    return Answers(writer="gw", fallbacks=kwargs.pop("fallbacks", FALLBACKS), **kwargs)


def _failure() -> ToolResult:
    return tool_error_result(CALL, "ValueError", "bad", elapsed_ms=5, attempt=1)


def _open(call_id: str, state: CallState = CallState.PENDING) -> OpenCall:
    return OpenCall(call_id, "fetch", state, deadline_ms=10_000, attempt=0, lease_alive=False,
                    idempotent=False, dispatched=True, submitted_ms=1_000)  # fmt: skip


# -- the rules ---------------------------------------------------------------------------------


def test_a_first_answer_is_written_with_its_fallback_and_returned_without_a_read() -> None:
    ledger = _fake(FakeLedger, wins=True)
    answered = _answers().answer(KEYS, _failure(), now_ms=7).on(ledger)
    assert answered.won
    assert (answered.result.is_error, answered.result.text) == (False, "cached")
    assert ledger.methods == ["finish"]
    _, (_, written), kwargs = ledger.calls[0]
    assert written == answered.result
    assert kwargs == {"now_ms": 7, "writer": "gw", "submitted_ms": None}


def test_a_losing_writer_gets_the_kept_answer_back() -> None:
    kept = success_result(CALL, "the real one", elapsed_ms=3, attempt=1)
    ledger = _fake(FakeLedger, wins=False, kept=kept)
    answered = _answers().answer(KEYS, _failure(), now_ms=7, writer="w2").on(ledger)
    assert (answered.won, answered.result) == (False, kept)
    assert ledger.methods == ["finish", "results"]
    assert ledger.calls[0][2]["writer"] == "w2"


def test_offer_never_reads_back() -> None:
    ledger = _fake(FakeLedger, wins=False, kept=_failure())
    assert _answers().offer(KEYS, _failure(), now_ms=7, submitted_ms=3).on(ledger) is False
    assert ledger.methods == ["finish"]
    assert ledger.calls[0][2]["submitted_ms"] == 3


async def test_the_asyncio_driver_sends_the_same_steps_as_the_sync_one() -> None:
    kept = success_result(CALL, "real", elapsed_ms=3, attempt=1)
    sync, aio = _fake(FakeLedger, wins=False, kept=kept), _fake(AsyncFakeLedger, wins=False, kept=kept)
    answers = _answers()
    by_sync = answers.answer(KEYS, _failure(), now_ms=7).on(sync)
    by_async = await answers.answer(KEYS, _failure(), now_ms=7).on_async(aio)
    assert by_sync == by_async
    assert sync.calls == aio.calls
    reaps = [Reap(_open("c1"), ActionKind.ANSWER, _failure()), Reap(_open("c2"), ActionKind.REQUEUE)]
    assert answers.reap(KEYS, reaps, now_ms=9).on(sync) == await answers.reap(KEYS, reaps, now_ms=9).on_async(
        aio
    )
    assert sync.calls == aio.calls


def test_reaped_answers_get_their_fallback_and_resends_stay() -> None:
    ledger = _fake(
        FakeLedger,
    )
    reaps = [Reap(_open("c1"), ActionKind.ANSWER, _failure()), Reap(_open("c2"), ActionKind.REQUEUE)]
    assert _answers().reap(KEYS, reaps, now_ms=9).on(ledger) == (1, ["c2"])
    _, (_, sent), kwargs = ledger.calls[0]
    assert sent[0].answer.text == "cached"
    assert sent[1] == reaps[1]
    assert kwargs == {"now_ms": 9, "writer": "gw"}


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (_failure(), "declared"),  # the tool's own failure: its declared fallback
        (deadline_result(CALL, submitted_ms=0, deadline_ms=10), None),  # any process writes it
        (synthetic_result(CALL, SyntheticReason.CANCELLED, elapsed_ms=1, attempt=0), None),
    ],
)
def test_declared_fallbacks_never_replace_answers_every_process_writes(
    result: ToolResult, expected: str | None
) -> None:
    answers = _answers(fallbacks={}, declared=lambda tool: FallbackRule("declared"))
    given = answers.given(result)
    assert (given.text if expected else given) == (expected or result)


def test_config_fallbacks_win_over_declared_ones_and_cover_every_answer() -> None:
    answers = _answers(declared=lambda tool: FallbackRule("declared"))
    assert answers.given(_failure()).text == "cached"
    assert answers.given(deadline_result(CALL, submitted_ms=0, deadline_ms=10)).text == "cached"


def test_a_refusal_is_written_as_it_is() -> None:
    refusal = synthetic_result(CALL, SyntheticReason.INVALID_ARGUMENTS, elapsed_ms=0, attempt=0)
    assert _answers().given(refusal) is refusal


def test_handing_on_without_a_store_gives_the_fallback_and_queues_it() -> None:
    later: list[ToolResult] = []
    answers = _answers()
    ledger = _fake(FakeLedger, fail=True)
    handed = answers.hand_on(KEYS, _failure(), now_ms=7, store_later=lambda k, r: later.append(r)).on(ledger)
    assert handed.text == "cached"
    assert later == [handed]


def test_a_won_answer_handed_on_is_kept_until_a_replica_holds_it() -> None:
    ledger = _fake(FakeLedger, wins=True)
    handed = _answers().hand_on(KEYS, _failure(), now_ms=7).on(ledger)
    assert ledger.methods == ["finish", "handed"]
    assert ledger.calls[1][1][1] == {"c1": handed}


def test_an_immediate_answer_of_a_known_call_is_the_kept_one() -> None:
    kept = success_result(CALL, "earlier", elapsed_ms=1, attempt=1)
    ledger = _fake(FakeLedger, kept=kept)
    ledger.registration = Registration(created=False, run_status=RunStatus.RUNNING, guard_armed=False)
    immediate = _answers().record_immediate(KEYS, _failure(), now_ms=7, fields={}).on(ledger)
    assert immediate.result == kept
    assert ledger.methods == ["register_call", "results"]


def test_an_immediate_answer_of_a_new_call_is_written_with_its_fallback() -> None:
    ledger = _fake(
        FakeLedger,
    )
    immediate = _answers().record_immediate(KEYS, _failure(), now_ms=7, fields={}).on(ledger)
    assert immediate.result.text == "cached"
    assert ledger.methods == ["register_call", "finish"]


def test_an_immediate_answer_for_an_ended_run_is_left_to_the_caller() -> None:
    ledger = _fake(
        FakeLedger,
    )
    ledger.registration = Registration(created=False, run_status=RunStatus.ABORTED, guard_armed=False)
    immediate = _answers().record_immediate(KEYS, _failure(), now_ms=7, fields={}).on(ledger)
    assert immediate.registration.refused
    assert ledger.methods == ["register_call"]


def test_a_cancel_answers_only_calls_no_worker_holds() -> None:
    ledger = _fake(
        FakeLedger,
    )
    ledger.open = [_open("idle"), _open("running", CallState.RUNNING)]
    seen: list[str] = []
    answered = (
        _answers(fallbacks={})
        .cancel(
            KEYS,
            ["idle", "running"],
            now_ms=7,
            detail=" (test)",
            on_answering=lambda c: seen.append(c.call_id),
        )
        .on(ledger)
    )
    assert [call.call_id for call in answered] == seen == ["idle"]
    [(_, (_, written), _)] = [c for c in ledger.calls if c[0] == "finish"]
    assert written.reason == SyntheticReason.CANCELLED.value
