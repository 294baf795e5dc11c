"""Which reason the worker's main process answers for each way a task of a call can fail.

The request's failure hook is driven directly (no pool, no Redis): billiard decides when each
callback runs, and a loaded machine reorders them, so every order is checked here by hand.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from billiard.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded, WorkerLostError
from celery.worker.request import Request

from workers.celery_edge import request as request_module
from workers.celery_edge.request import GuardedRequest
from workers.core.models import SyntheticReason, ToolCall
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
