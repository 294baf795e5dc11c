"""A message a busy worker took ahead is given back, so another worker runs its call.

A worker takes messages ahead of its free pool processes (prefetch). A message taken while
every pool process runs a long call would wait for one of them while other workers idle;
the worker publishes it again once it has waited ``worker.give_back_after_ms`` unstarted
(workers/worker/held_messages.py). The gateway's own republish is off here, so only the
worker's give-back can move the call.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests.harness import (
    GatewayOn,
    WorkerOn,
    base_env,
    call_in_thread,
    recorded_runs,
    task_outcome,
    wait_until,
)
from workers import ToolGateway
from workers.core.models import CallState, ToolCall
from workers.store.keys import broker_queue_key
from workers.store.records import CallField, CallRecord

HOG_S = 12.0  # longer than the give-back, a worker's start (slower under a parallel run) and the quick call


def _record(gateway: ToolGateway, session: str, call_id: str) -> CallRecord | None:
    ledger = gateway._rt.ledger
    return ledger.record(ledger.keys(session, "r"), call_id)


def _state(gateway: ToolGateway, session: str, call_id: str) -> CallState | None:
    record = _record(gateway, session, call_id)
    return None if record is None else record.state


def _republishes(gateway: ToolGateway, session: str, call_id: str) -> int:
    record = _record(gateway, session, call_id)
    return 0 if record is None else record.row.integer(CallField.REPUBLISHES)


@pytest.mark.timeout(60)
def test_a_message_held_behind_a_long_call_is_given_back_and_another_worker_runs_it(
    redis_url: str, runs_file: Path, gateway_on: GatewayOn, worker_on: WorkerOn
) -> None:
    # Given one worker with one pool process, busy with a long call, and no gateway republish
    env = base_env(redis_url, RECORD_RUN_FILE=str(runs_file), UNSTUCK_GATEWAY__REPUBLISH_UNCLAIMED="false")
    gateway = gateway_on(env)
    busy = worker_on(env, concurrency=1)
    hog_thread, hog = call_in_thread(
        gateway, "busy", ToolCall(id="h", name="slow", arguments={"seconds": HOG_S})
    )
    wait_until(
        lambda: _state(gateway, "busy", "h") is CallState.RUNNING,
        timeout_s=10,
        what="the long call running",
    )
    # When a quick call comes: the busy worker takes its message ahead, then gives it back
    thread, results = call_in_thread(
        gateway, "quick", ToolCall(id="q", name="record_run", arguments={"tag": "q"})
    )
    wait_until(
        lambda: _republishes(gateway, "quick", "q") == 1,
        timeout_s=5,
        what="the quick call's message given back",
    )
    broker = redis.Redis.from_url(gateway.settings.broker_url)
    queue = broker_queue_key(gateway.settings.broker.queue)
    # (the ledger counts the republish first, then the worker publishes the copy)
    wait_until(lambda: broker.llen(queue) == 1, timeout_s=5, what="the copy in the queue")
    broker.close()
    # Then another worker runs it while the long call still runs
    idle = worker_on(env, concurrency=1)
    thread.join(timeout=20)
    assert [(r.is_error, r.text) for r in results] == [(False, "recorded q")]
    assert hog_thread.is_alive(), "the quick call waited for the long one"
    assert "record_run [quick/r]" in idle.log()
    # and the copy the busy worker still held runs nothing when its turn comes
    hog_thread.join(timeout=20)
    assert [r.is_error for r in hog] == [False]
    record = _record(gateway, "quick", "q")
    assert record is not None
    task_id = record.row.text(CallField.TASK_ID)
    wait_until(
        lambda: task_outcome(busy.log(), task_id) is not None, timeout_s=10, what="the held copy's turn"
    )
    assert recorded_runs(runs_file) == ["q"]
