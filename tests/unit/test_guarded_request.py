"""Which reason the worker's main process answers for each way a task of a call can fail.

The request's failure hook is driven directly (no pool, no Redis): billiard decides when each
callback runs, and a loaded machine reorders them, so every order is checked here by hand.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from billiard.exceptions import SoftTimeLimitExceeded, Terminated, TimeLimitExceeded, WorkerLostError
from celery.exceptions import Ignore, Reject, Retry
from celery.worker.request import Request

from workers.celery_edge import request as request_module
from workers.celery_edge.request import GuardedRequest
from workers.core.models import SyntheticReason, ToolCall, ToolResult
from workers.core.outcome import outcome_of
from workers.core.results import synthetic_result
from workers.worker import lost_calls

SOFT_S = 1.0


def _kwargs() -> dict[str, Any]:
    call = ToolCall(id="c-hung", name="stubborn", arguments={"seconds": 30})
    now_ms = int(time.time() * 1000)
    job = {
        "session_key": "s1",
        "run_id": "r1",
        "call": call.model_dump(),
        "submitted_ms": now_ms,
        "deadline_ms": now_ms + 10_000,
        "soft_s": SOFT_S,
        "hard_s": 2.0,
    }
    return {"job": job}


@pytest.fixture
def answered(monkeypatch: pytest.MonkeyPatch) -> list[SyntheticReason | str]:
    """The reasons the main process answered, in order ("lost child": the crash path's)."""
    reasons: list[SyntheticReason | str] = []
    monkeypatch.setattr(Request, "on_failure", lambda *_args, **_kwargs: None)
    monkeypatch.setattr(
        lost_calls, "answer_from_main_process", lambda _kwargs, reason, detail="": reasons.append(reason)
    )
    monkeypatch.setattr(
        request_module, "answer_from_main_process", lambda _kwargs, reason: reasons.append(reason)
    )
    monkeypatch.setattr(
        request_module, "answer_lost_child", lambda *_args, **_kwargs: reasons.append("lost child")
    )
    return reasons


def _request(started_ago_s: float) -> GuardedRequest:
    request = GuardedRequest.__new__(GuardedRequest)
    request._kwargs = _kwargs()  # type: ignore[attr-defined]  # what Celery's Request.kwargs reads
    request.time_start = time.time() - started_ago_s
    request.worker_pid = "4242"
    request.id = "t-hung"
    return request


def _fail(request: GuardedRequest, exc: BaseException) -> None:
    # The pool's wrapper of a child's exception, as billiard hands it to the request.
    request.on_failure(SimpleNamespace(exception=SimpleNamespace(exc=exc)))


def test_a_soft_limit_interrupt_that_ended_the_task_outside_the_tool_is_answered_timeout_soft(
    answered: list[SyntheticReason | str],
) -> None:
    # Given a call whose soft limit passed while unstuck's own code ran before the tool
    request = _request(started_ago_s=SOFT_S + 0.3)
    # When the interrupt, not caught by the tool's handling, ends the task
    _fail(request, SoftTimeLimitExceeded())
    # Then the call timed out: the child lives on, nothing crashed
    assert answered == [SyntheticReason.TIMEOUT_SOFT]


def test_a_soft_limit_interrupt_before_the_calls_soft_limit_is_a_crash(
    answered: list[SyntheticReason | str],
) -> None:
    # Given a call that started just now (an earlier job's late interrupt reached its process)
    request = _request(started_ago_s=0.1)
    # When the interrupt ends the task
    _fail(request, SoftTimeLimitExceeded())
    # Then the task broke before its own limit
    assert answered == [SyntheticReason.CRASHED]


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (TimeLimitExceeded(2.0), SyntheticReason.TIMEOUT_HARD),
        (WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL)"), "lost child"),
    ],
)
def test_the_hard_limit_and_a_lost_child_keep_their_answers(
    answered: list[SyntheticReason | str], exc: BaseException, reason: SyntheticReason | str
) -> None:
    # Given / When
    _fail(_request(started_ago_s=SOFT_S + 0.3), exc)
    # Then
    assert answered == [reason]


# The task's closing event: the call's answer replaces Celery's task-failed, through the hooks
# Celery documents for a request class (on_failure's send_failed_event, on_timeout).


def test_the_request_hooks_celery_documents_keep_their_shapes() -> None:
    def params(func: object) -> list[str]:
        return list(inspect.signature(func).parameters)  # type: ignore[arg-type]

    assert params(Request.on_timeout) == ["self", "soft", "timeout"]
    assert params(Request.on_failure) == ["self", "exc_info", "send_failed_event", "return_ok"]
    assert params(Request.send_event) == ["self", "type", "fields"]
    assert params(Request.on_accepted) == ["self", "pid", "time_accepted"]  # a held message started
    # what a held message is given back from (workers/celery_edge/give_back.py)
    assert {"message", "task", "kwargs"} <= set(dir(Request))
    assert "worker_pid" in vars(Request)  # set when the pool accepts the task


@dataclass
class _Celery:
    """What Celery's own request did: its failure handling's event flag, its timeouts, our events."""

    failed_event_flags: list[bool] = field(default_factory=list)
    timeouts: list[bool] = field(default_factory=list)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


@pytest.fixture
def celery(monkeypatch: pytest.MonkeyPatch, answered: list[SyntheticReason | str]) -> _Celery:
    seen = _Celery()

    def on_failure(
        _self: Request, _info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        seen.failed_event_flags.append(send_failed_event)

    def send_event(_self: Request, type: str, **fields: Any) -> None:
        seen.events.append((type, fields))

    monkeypatch.setattr(Request, "on_failure", on_failure)
    monkeypatch.setattr(Request, "on_timeout", lambda _self, soft, _timeout: seen.timeouts.append(soft))
    monkeypatch.setattr(Request, "send_event", send_event)
    monkeypatch.setattr(Request, "eventer", property(lambda _self: SimpleNamespace(enabled=True)))
    monkeypatch.setattr(Request, "name", property(lambda _self: "stubborn · s1/r1"), raising=False)
    return seen


def _stored(monkeypatch: pytest.MonkeyPatch, answer: ToolResult | None) -> None:
    monkeypatch.setattr(GuardedRequest, "_stored_answer", lambda _self: answer)


def _answer(reason: SyntheticReason = SyntheticReason.CRASHED) -> ToolResult:
    call = ToolCall(id="c-hung", name="stubborn", arguments={})
    return synthetic_result(call, reason, elapsed_ms=5, attempt=1)


def test_a_lost_childs_task_closes_with_the_calls_answer_not_celerys_failure(
    celery: _Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stored(monkeypatch, _answer())
    _fail(_request(started_ago_s=1.0), WorkerLostError("signal 9"))
    assert celery.failed_event_flags == [False]  # Celery's own task-failed is not sent
    ((type, fields),) = celery.events
    assert type == "task-failed"
    assert "crashed" in fields["exception"]
    assert fields["traceback"] == ""
    assert fields["name"] == "stubborn · s1/r1"


def test_a_call_that_failed_in_its_task_closes_with_its_failure(celery: _Celery) -> None:
    failure = outcome_of(_answer(SyntheticReason.CANCELLED)).failure()
    _fail(_request(started_ago_s=1.0), failure)
    assert celery.failed_event_flags == [False]
    ((type, _fields),) = celery.events
    assert type == "task-revoked"  # a cancelled call is a revoked task, not a failed one


def test_with_no_stored_answer_celerys_own_failure_event_closes_the_task(
    celery: _Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stored(monkeypatch, None)
    _fail(_request(started_ago_s=1.0), WorkerLostError("signal 9"))
    assert (celery.failed_event_flags, celery.events) == ([True], [])


@pytest.mark.parametrize("exc", [Ignore(), Retry(), Terminated("SIGTERM"), Reject("again", requeue=True)])
def test_ends_celery_sends_no_task_failed_for_get_none_of_ours(
    celery: _Celery, monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> None:
    _stored(monkeypatch, _answer())
    _fail(_request(started_ago_s=1.0), exc)
    assert (celery.failed_event_flags, celery.events) == ([True], [])


def test_a_hard_limit_closes_its_task_once_with_the_calls_answer(
    celery: _Celery, monkeypatch: pytest.MonkeyPatch, answered: list[SyntheticReason | str]
) -> None:
    # Given billiard's order on a hard limit: the job failed (on_failure), then the timeout
    _stored(monkeypatch, _answer())
    request = _request(started_ago_s=3.0)
    _fail(request, TimeLimitExceeded(2.0))
    request.on_timeout(False, 2.0)
    # Then one closing event, and Celery's hard-limit handling (a raw task-failed) never ran
    assert [type for type, _ in celery.events] == ["task-failed"]
    assert (celery.failed_event_flags, celery.timeouts) == ([False], [])
    assert answered == [SyntheticReason.TIMEOUT_HARD]


def test_a_soft_limit_is_celerys_to_handle(celery: _Celery) -> None:
    _request(started_ago_s=1.0).on_timeout(True, 1.0)
    assert (celery.timeouts, celery.events) == ([True], [])
