"""Celery's INFO line for every task is in a tool worker's log only with ``worker.log_each_task``.

Off by default: the received and succeeded lines cost a call about a tenth of the worker's
throughput (docs/performance.md), and each call is in the ledger, Flower's task events and
its spans anyway. The test harness turns them on, because tests read a task's end from them.
"""

from __future__ import annotations

import pytest

from tests.harness import GatewayOn, Proc, WorkerOn, base_env, wait_until
from workers.core.models import ToolCall
from workers.settings import WorkerSettings

# Celery's lines: "Task <name>[<id>] received" (the main process), "... succeeded in <s>s: ..."
# and "... raised expected: ..." (the pool child).
_TASK_LINES = (" received", " succeeded in ", " raised expected")
_CALLS = (
    ToolCall(id="ok", name="echo", arguments={"text": "a"}),
    ToolCall(id="fails", name="boom", arguments={}),
    ToolCall(id="last", name="echo", arguments={"text": "b"}),
)


def _task_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if any(mark in line for mark in _TASK_LINES)]


def _count(log: str, mark: str) -> int:
    return sum(mark in line for line in log.splitlines())


def _worker_after_the_calls(
    redis_url: str, log_each_task: str, worker_on: WorkerOn, gateway_on: GatewayOn
) -> Proc:
    """A worker of one pool process with the setting, after a success, a failure and one more call.

    The one process runs them in turn: "last" is answered only after the tasks before it have
    ended, their lines (if any) logged by the same child, in order.
    """
    env = base_env(redis_url, UNSTUCK_WORKER__LOG_EACH_TASK=log_each_task)
    worker = worker_on(env, concurrency=1)
    gateway = gateway_on(env)
    for call in _CALLS:
        [result] = gateway.call_tools(session_key="s", run_id="r", calls=[call])
        assert result.is_error == (call.id == "fails"), result
    return worker


def test_the_shipped_default_is_off() -> None:
    assert WorkerSettings().log_each_task is False


@pytest.mark.timeout(60)
def test_a_worker_logs_no_line_per_task_by_default(
    redis_url: str, worker_on: WorkerOn, gateway_on: GatewayOn
) -> None:
    # Given a worker with the shipped setting (the harness turns the lines on)
    # When it runs a call that succeeds, one that fails, and one more after them
    worker = _worker_after_the_calls(redis_url, "false", worker_on, gateway_on)
    # Then its log has no line for any of their tasks, but still its start
    log = worker.log()
    assert " ready." in log
    assert _task_lines(log) == []


@pytest.mark.timeout(60)
def test_a_worker_logs_each_task_when_asked(
    redis_url: str, worker_on: WorkerOn, gateway_on: GatewayOn
) -> None:
    # Given a worker asked for the lines
    # When it runs the same calls
    worker = _worker_after_the_calls(redis_url, "true", worker_on, gateway_on)
    # Then each task was logged as received, and as it ended
    expected = {" received": 3, " succeeded in ": 2, " raised expected": 1}
    wait_until(
        lambda: {mark: _count(worker.log(), mark) for mark in expected} == expected,
        timeout_s=10,
        what=f"the task lines {expected}",
    )
