"""The waiting step machine: what a driver does next, given the time and what it read."""

from __future__ import annotations

from workers.answering.service import Answers
from workers.core.failure_policy import FallbackRule
from workers.core.models import CallState, SyntheticReason, ToolCall, ToolResult
from workers.core.reaping import ActionKind, OpenCall, Reap, ReapRules, reaps
from workers.core.results import deadline_result, success_result
from workers.core.waiting import AnswerLocally, Block, Check, Finish, Read, Store, Waiting

T0 = 1_000_000
MARGIN_MS = 1_000
CHECK_MS = 500


def _ok(call_id: str) -> ToolResult:
    return success_result(ToolCall(id=call_id, name="echo"), "ok", elapsed_ms=1, attempt=1)


def _machine(deadlines: dict[str, int], **fields: object) -> Waiting:
    fields.setdefault("next_check_ms", T0 + CHECK_MS)
    return Waiting(
        deadlines=deadlines,
        margin_ms=MARGIN_MS,
        rules=ReapRules(min_rerun_ms=3_000),
        **fields,  # type: ignore[arg-type]  # the optional fields a test sets
    )


def _open(call_id: str, **fields: object) -> OpenCall:
    values: dict[str, object] = {
        "call_id": call_id,
        "tool": "echo",
        "state": CallState.RUNNING,
        "deadline_ms": T0 + 60_000,
        "attempt": 1,
        "lease_alive": False,
        "idempotent": True,
        "dispatched": True,
        "submitted_ms": T0 - 5_000,
    }
    values.update(fields)
    return OpenCall(**values)  # type: ignore[arg-type]  # the fields above, typed by OpenCall


def test_a_new_call_blocks_until_the_next_check_then_finishes_with_what_it_read() -> None:
    machine = _machine({"c1": T0 + 60_000})
    # The first step blocks (nothing to read first, nothing prepared, nothing past due) ...
    assert machine.step(T0) == Block(["c1"], CHECK_MS / 1000)
    # ... and the answer it read ends the wait
    machine.learn({"c1": _ok("c1")})
    assert machine.step(T0 + 10) == Finish({"c1": _ok("c1")})


def test_calls_to_read_first_are_read_once_before_the_first_block() -> None:
    machine = _machine({"c1": T0 + 60_000, "c2": T0 + 60_000}, read_first=["c1"])
    assert machine.step(T0) == Read(["c1"])
    assert isinstance(machine.step(T0), Block)


def test_a_block_never_outlasts_the_soonest_deadline_plus_margin() -> None:
    machine = _machine({"c1": T0 + 200}, next_check_ms=T0 + 60_000)
    assert machine.step(T0) == Block(["c1"], (200 + MARGIN_MS) / 1000)


def test_a_due_check_follows_the_block_and_the_next_one_is_what_the_driver_says() -> None:
    machine = _machine({"c1": T0 + 60_000})
    assert isinstance(machine.step(T0), Block)
    assert machine.step(T0 + CHECK_MS) == Check(["c1"])
    machine.checked(T0 + 2 * CHECK_MS)
    assert machine.step(T0 + CHECK_MS) == Block(["c1"], CHECK_MS / 1000)


def test_no_check_before_it_is_due() -> None:
    machine = _machine({"c1": T0 + 60_000})
    assert isinstance(machine.step(T0), Block)
    assert isinstance(machine.step(T0 + CHECK_MS - 1), Block)


def test_prepared_answers_are_stored_each_round_until_the_store_takes_them() -> None:
    prepared = {"c1": _ok("c1")}
    machine = _machine({"c1": T0 + 60_000}, prepared=prepared)
    assert machine.step(T0) == Store([_ok("c1")])
    assert isinstance(machine.step(T0), Block)  # the store failed: the round goes on
    assert machine.unreachable(T0) == 0.2
    assert machine.step(T0 + 200) == Store([_ok("c1")])


def test_past_deadline_plus_margin_the_canonical_deadline_result_is_answered_locally() -> None:
    machine = _machine({"c1": T0}, tools={"c1": "echo"}, submitted={"c1": T0 - 4_000})
    assert isinstance(machine.step(T0 + MARGIN_MS - 1), Block)
    machine.unreachable(T0 + MARGIN_MS - 1)
    expected = deadline_result(ToolCall(id="c1", name="echo"), submitted_ms=T0 - 4_000, deadline_ms=T0)
    assert machine.step(T0 + MARGIN_MS) == AnswerLocally([expected])
    machine.learn({"c1": expected})
    assert machine.step(T0 + MARGIN_MS) == Finish({"c1": expected})


def test_the_prepared_answer_wins_over_the_deadline_result_when_answering_locally() -> None:
    machine = _machine({"c1": T0}, prepared={"c1": _ok("c1")})
    assert machine.step(T0 + MARGIN_MS) == Store([_ok("c1")])
    assert machine.step(T0 + MARGIN_MS) == AnswerLocally([_ok("c1")])


def test_what_is_answered_locally_is_what_the_ledger_would_store_with_the_tools_fallback() -> None:
    # The machine decides the raw deadline answer; the answering service adds the fallback
    fallbacks = {"echo": FallbackRule({"status": "unknown"})}
    machine = _machine({"c1": T0}, tools={"c1": "echo"}, submitted={"c1": T0 - 4_000})
    raw = deadline_result(ToolCall(id="c1", name="echo"), submitted_ms=T0 - 4_000, deadline_ms=T0)
    step = machine.step(T0 + MARGIN_MS)
    assert step == AnswerLocally([raw])
    given = Answers(writer="gw", fallbacks=fallbacks).given(raw)
    assert not given.is_error
    assert given.reason == SyntheticReason.DEADLINE_EXCEEDED.value


def test_the_pause_after_a_store_error_ends_at_the_soonest_deadline_plus_margin() -> None:
    machine = _machine({"c1": T0})
    assert machine.unreachable(T0 + MARGIN_MS - 50) == 0.05
    assert machine.unreachable(T0 + MARGIN_MS + 50) == 0.0


def test_calls_the_batch_has_answers_for_are_not_waited_for() -> None:
    machine = _machine({"c1": T0, "c2": T0 + 60_000}, answered=frozenset({"c1"}))
    assert machine.waiting == ["c2"]
    assert machine.step(T0) == Block(["c2"], CHECK_MS / 1000)


def test_a_lost_idempotent_call_is_handed_back_when_the_driver_can_send_tasks() -> None:
    lost = _open("c1")
    planned = reaps([lost], ReapRules(min_rerun_ms=3_000), now_ms=T0)
    assert planned == [Reap(lost, ActionKind.REQUEUE)]


def test_without_redispatch_a_lost_call_is_answered_worker_lost_and_nothing_is_republished() -> None:
    lost, unclaimed = _open("c1"), _open("c2", state=CallState.PENDING, submitted_ms=T0 - 10_000)
    rules = ReapRules(min_rerun_ms=3_000, can_redispatch=False, republish_after_ms=1_000)
    [planned] = reaps([lost, unclaimed], rules, now_ms=T0)
    assert planned.kind is ActionKind.ANSWER
    assert planned.answer is not None
    assert planned.answer.reason == SyntheticReason.WORKER_LOST.value


def test_an_unclaimed_message_is_republished_when_the_driver_can_send_tasks() -> None:
    unclaimed = _open("c2", state=CallState.PENDING, submitted_ms=T0 - 10_000)
    rules = ReapRules(min_rerun_ms=3_000, republish_after_ms=1_000)
    assert reaps([unclaimed], rules, now_ms=T0) == [Reap(unclaimed, ActionKind.REPUBLISH)]


def test_an_overdue_call_is_answered_with_the_deadline_result() -> None:
    overdue = _open("c1", deadline_ms=T0, lease_alive=True)
    [planned] = _machine({"c1": T0}).reaps([overdue], now_ms=T0)
    assert planned.answer == deadline_result(
        ToolCall(id="c1", name="echo"), submitted_ms=overdue.submitted_ms, deadline_ms=T0
    )


def test_a_reaped_answer_is_delivered_with_the_tools_fallback() -> None:
    # Given a fallback for echo's deadline and worker_lost answers
    fallbacks = {"echo": FallbackRule("cached", reasons=(SyntheticReason.DEADLINE_EXCEEDED,))}
    overdue = _open("c1", deadline_ms=T0, lease_alive=True)
    lost = _open("c2")
    rules = ReapRules(min_rerun_ms=3_000, can_redispatch=False)
    # When the watchdog's rules reap both, and a waiting machine reaps the overdue one
    by_watchdog = reaps([overdue, lost], rules, now_ms=T0)
    [by_gateway] = _machine({"c1": T0}).reaps([overdue], now_ms=T0)
    # Then both decide the same raw answer, and the answering service gives it the default;
    # worker_lost stays an error
    service = Answers(writer="any", fallbacks=fallbacks)
    answers = {reap.call.call_id: service.given(reap.answer) for reap in by_watchdog if reap.answer}
    raw = deadline_result(ToolCall(id="c1", name="echo"), submitted_ms=overdue.submitted_ms, deadline_ms=T0)
    assert by_gateway.answer == raw
    assert answers["c1"] == service.given(raw)
    assert (answers["c1"].is_error, answers["c1"].text) == (False, "cached")
    assert answers["c2"] is not None
    assert (answers["c2"].is_error, answers["c2"].reason) == (True, SyntheticReason.WORKER_LOST.value)
