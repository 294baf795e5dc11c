"""A call's result -> its task's final state, failure and closing event (what Flower shows)."""

from __future__ import annotations

import pickle

import pytest

from workers.celery_edge.app_config import celery_config
from workers.core.models import SyntheticReason, ToolCall
from workers.core.outcome import CALL_FAILURES, TaskState, closing_event, failure_event, outcome_of
from workers.core.results import fallback_result, success_result, synthetic_result, tool_error_result
from workers.errors import CallFailed
from workers.settings import Settings

CALL = ToolCall(id="c1", name="fetch", arguments={})
ToolFailed = CALL_FAILURES[SyntheticReason.TOOL_ERROR]
Cancelled = CALL_FAILURES[SyntheticReason.CANCELLED]

# What Flower shows as each failed task's exception class, one per reason.
FLOWER_NAMES = {
    "timeout_soft": "TimeoutSoft",
    "timeout_hard": "TimeoutHard",
    "heartbeat_timeout": "HeartbeatTimeout",
    "worker_lost": "WorkerLost",
    "crashed": "Crashed",
    "out_of_memory": "OutOfMemory",
    "invalid_arguments": "ArgumentsInvalid",
    "unknown_tool": "UnknownTool",
    "tool_not_allowed": "ToolNotAllowed",
    "dispatch_failed": "DispatchFailed",
    "deadline_exceeded": "DeadlineExceeded",
    "cancelled": "Cancelled",
    "tool_error": "ToolFailed",
    "loop_blocked": "LoopBlocked",
    "run_aborted": "RunAborted",
    "circuit_open": "CircuitOpen",
    "call_mismatch": "CallMismatch",
    "still_running": "StillRunning",
}


def test_each_reason_has_one_failure_class_under_the_name_flower_shows() -> None:
    assert {reason: cls.__name__ for reason, cls in CALL_FAILURES.items()} == FLOWER_NAMES
    assert all(cls.reason == reason and issubclass(cls, CallFailed) for reason, cls in CALL_FAILURES.items())


def test_a_tools_success_is_the_only_success() -> None:
    outcome = outcome_of(success_result(CALL, {"rows": 3}, elapsed_ms=12, attempt=2))
    assert outcome.state is TaskState.SUCCESS
    assert outcome.info() == {"outcome": "ok", "reason": None, "elapsed_ms": 12, "attempt": 2}
    event_type, fields = closing_event(outcome)
    assert event_type == "task-succeeded"
    assert fields == {"result": repr(outcome.info())}


def test_a_tool_error_fails_with_the_tools_error_in_the_message_and_no_traceback() -> None:
    result = tool_error_result(CALL, "ConnectionError", "upstream returned 503", elapsed_ms=5, attempt=1)
    outcome = outcome_of(result)
    assert outcome.state is TaskState.FAILURE
    failure = outcome.failure()
    assert type(failure) is ToolFailed
    assert str(failure) == "tool_error: Tool 'fetch' failed with ConnectionError: upstream returned 503"
    event_type, fields = closing_event(outcome)
    assert event_type == "task-failed"
    assert fields["exception"].startswith("ToolFailed(\"tool_error: Tool 'fetch' failed with ConnectionError")
    assert fields["traceback"] == ""
    assert "'reason': 'tool_error'" in fields["result"]


@pytest.mark.parametrize("reason", [r for r in SyntheticReason if r is not SyntheticReason.TOOL_ERROR])
def test_every_synthetic_reason_has_a_failure_class_that_names_it(reason: SyntheticReason) -> None:
    outcome = outcome_of(synthetic_result(CALL, reason, elapsed_ms=1, attempt=0))
    failure = outcome.failure()
    assert type(failure) is CALL_FAILURES[reason.value]
    assert failure.reason == reason.value
    assert str(failure).startswith(f"{reason.value}: ")


@pytest.mark.parametrize(
    ("reason", "event_type"),
    [
        (SyntheticReason.CANCELLED, "task-revoked"),
        (SyntheticReason.RUN_ABORTED, "task-revoked"),
        (SyntheticReason.WORKER_LOST, "task-failed"),
        (SyntheticReason.DEADLINE_EXCEEDED, "task-failed"),
        (SyntheticReason.LOOP_BLOCKED, "task-failed"),
    ],
)
def test_withdrawn_calls_are_revoked_and_the_rest_failed(reason: SyntheticReason, event_type: str) -> None:
    event, fields = closing_event(outcome_of(synthetic_result(CALL, reason, elapsed_ms=1, attempt=0)))
    assert event == event_type
    assert reason.value in fields["exception"]
    assert reason.value in fields["result"]


def test_a_fallback_is_a_failure_that_says_the_fallback_was_delivered() -> None:
    result = fallback_result(
        CALL, {"status": "unknown"}, SyntheticReason.TIMEOUT_SOFT, elapsed_ms=1000, attempt=1
    )
    outcome = outcome_of(result)
    assert outcome.outcome == "fallback"
    assert outcome.state is TaskState.FAILURE
    assert str(outcome.failure()).startswith("fallback delivered after timeout_soft: ")


def test_a_loop_warning_is_part_of_the_info() -> None:
    warning = {"detector": "generic_repeat", "count": 3}
    outcome = outcome_of(success_result(CALL, "x", elapsed_ms=1, attempt=1), warning)
    assert outcome.info()["loop_warning"] == warning
    assert "'loop_warning'" in closing_event(outcome)[1]["result"]


def test_secrets_are_masked_and_long_texts_cut_in_the_failure() -> None:
    message = "auth failed for redis://app:s3cret@db:6379/0 " + "x" * 2000
    outcome = outcome_of(tool_error_result(CALL, "AuthError", message, elapsed_ms=1, attempt=1))
    text = str(outcome.failure())
    assert "s3cret" not in text
    assert len(text) < 600
    assert text.endswith("...")


def test_a_failure_survives_the_pool_pipe_with_its_info() -> None:
    # The pool child pickles the exception to the main process, which builds the event from it.
    failure = outcome_of(
        synthetic_result(CALL, SyntheticReason.TIMEOUT_HARD, elapsed_ms=1, attempt=1)
    ).failure()
    copy = pickle.loads(pickle.dumps(failure))
    assert type(copy) is CALL_FAILURES[SyntheticReason.TIMEOUT_HARD]
    assert copy.info == failure.info
    assert failure_event(copy) == failure_event(failure)


def test_revoked_events_say_the_task_was_not_terminated() -> None:
    event, fields = failure_event(Cancelled("cancelled: by the watchdog", {"reason": "cancelled"}))
    assert event == "task-revoked"
    assert fields["terminated"] is False
    assert isinstance(Cancelled("x"), CallFailed)


def test_a_failed_call_is_reported_once_never_retried_or_redelivered() -> None:
    from tasks.invoke import invoke

    config = celery_config(Settings())
    # Acked on receipt: a FAILURE (or a lost child) never puts the message back
    assert config["task_acks_late"] is False
    assert not config.get("task_reject_on_worker_lost")
    # No automatic retry of the task: the ledger already holds the call's one answer
    assert not getattr(invoke, "autoretry_for", ())
    assert invoke.throws == (CallFailed,)  # an expected outcome: logged without a traceback
    # Flower sees tasks only through events (task-sent: the gateway's own, batched)
    assert config["worker_send_task_events"] is True
    assert config["task_send_sent_event"] is False
