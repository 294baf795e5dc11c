"""A task message lost before any worker claimed its call is published again, not waited out.

Tool workers take Redis messages without acks: a worker killed between taking a message and
claiming its call loses it (the short chaos soak once left a call waiting 150 s for its
deadline that way). The waiting gateway publishes an unclaimed call's message again one
lease after it went into the queue, then after two leases, four...; a call is claimed once
while pending, so however many copies there are, its tool runs once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.harness import (
    GatewayOn,
    Proc,
    WorkerOn,
    base_env,
    call_in_thread,
    registration_fields,
    send_by_hand,
    task_outcome,
    wait_until,
)
from workers import ToolGateway
from workers.celery_edge.names import INVOKE_TASK
from workers.core.models import CallJob, CallState, ToolCall
from workers.settings import Settings
from workers.store.keys import broker_queue_key
from workers.store.records import CallField, CallRecord

LEASE_S = 3  # base_env's lease: the first republish comes one lease after submission


@pytest.fixture
def env(redis_url: str, runs_file: Path) -> dict[str, str]:
    return base_env(redis_url, RECORD_RUN_FILE=str(runs_file))


@pytest.fixture
def broker(settings: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.broker_url)
    yield client
    client.close()


def _state(record: CallRecord | None) -> CallState | None:
    return None if record is None else record.state


def _runs(runs_file: Path) -> list[str]:
    return runs_file.read_text().splitlines() if runs_file.exists() else []


@pytest.mark.serial  # the republish after one lease must beat a 9 s deadline
@pytest.mark.timeout(60)
def test_a_message_lost_before_its_claim_is_published_again_and_runs(
    gateway: ToolGateway, settings: Settings, broker: redis.Redis, env: dict[str, str], worker_on: WorkerOn,
    runs_file: Path,
) -> None:  # fmt: skip
    # Given a call whose message a worker took and lost (taken off the queue, never claimed)
    queue = broker_queue_key(settings.broker.queue)
    started = time.monotonic()
    thread, results = call_in_thread(
        gateway, "lost", ToolCall(id="c1", name="record_run", arguments={"tag": "once"})
    )
    wait_until(lambda: broker.llen(queue) == 1, timeout_s=10, what="the call's message in the queue")
    assert broker.delete(queue) == 1
    # When a worker comes up afterwards
    worker_on(env)
    thread.join(timeout=40)
    # Then the call ran and got its tool's own answer, about one lease after submission
    waited_s = time.monotonic() - started
    [result] = results
    assert (result.is_error, result.text) == (False, "recorded once"), result
    assert LEASE_S <= waited_s < 20, waited_s  # its deadline is 5 s tool + 3 s queue allowance + grace
    assert _runs(runs_file) == ["once"]
    record = gateway._rt.ledger.record(gateway._rt.ledger.keys("lost", "r"), "c1")
    assert record is not None
    assert record.row.integer(CallField.REPUBLISHES) == 1
    # the same message again: one task in Flower, ending as the call did
    assert record.row.text(CallField.TASK_ID).endswith("#0")


@pytest.mark.timeout(90)
def test_a_call_queued_behind_a_busy_worker_runs_once_however_many_copies(
    gateway: ToolGateway, worker_on: WorkerOn, env: dict[str, str], runs_file: Path, broker: redis.Redis,
    settings: Settings,
) -> None:  # fmt: skip
    # Given one worker slot, busy for longer than two leases
    worker: Proc = worker_on(env, concurrency=1)
    hog_thread, hog = call_in_thread(
        gateway, "busy", ToolCall(id="h", name="slow", arguments={"seconds": 2.5 * LEASE_S})
    )
    # (running, not only off the queue: an empty queue is also what the hog's thread sees
    # before it has registered, and the call below would then run first, unqueued)
    ledger = gateway._rt.ledger
    wait_until(
        lambda: _state(ledger.record(ledger.keys("busy", "r"), "h")) is CallState.RUNNING,
        timeout_s=10,
        what="the hog running",
    )
    # When a call waits in the queue behind it (a real backlog, not a lost message)
    thread, results = call_in_thread(
        gateway, "queued", ToolCall(id="c1", name="record_run", arguments={"tag": "queued"})
    )
    thread.join(timeout=60)
    hog_thread.join(timeout=30)
    # Then it was published again while it waited, and still ran exactly once
    [result] = results
    assert (result.is_error, result.text) == (False, "recorded queued"), result
    assert [r.is_error for r in hog] == [False]
    record = gateway._rt.ledger.record(gateway._rt.ledger.keys("queued", "r"), "c1")
    assert record is not None
    assert record.row.integer(CallField.REPUBLISHES) >= 1
    wait_until(
        lambda: broker.llen(broker_queue_key(settings.broker.queue)) == 0, timeout_s=10, what="copies drained"
    )
    wait_until(lambda: worker.log().count("record_run [queued/r]") >= 2, timeout_s=10, what="the copy taken")
    assert _runs(runs_file) == ["queued"]


@pytest.mark.serial  # the republish after one lease must beat a 9 s deadline
@pytest.mark.timeout(60)
async def test_the_async_gateway_publishes_a_lost_message_again_too(
    agateway: ToolGateway, settings: Settings, broker: redis.Redis, env: dict[str, str], worker_on: WorkerOn
) -> None:
    # Given a call whose message was lost before any worker claimed it
    queue = broker_queue_key(settings.broker.queue)
    call = ToolCall(id="c1", name="echo", arguments={"text": "again"})
    waiting = asyncio.ensure_future(agateway.acall_tools(session_key="alost", run_id="r", calls=[call]))
    while broker.llen(queue) != 1:
        assert not waiting.done(), waiting.result()
        await asyncio.sleep(0.02)  # the broker has no async client here; polling it is the test's clock
    assert broker.delete(queue) == 1
    # When a worker comes up afterwards
    await asyncio.to_thread(worker_on, env)
    # Then the call gets its tool's own answer, well before its deadline
    [result] = await asyncio.wait_for(waiting, timeout=30)
    assert (result.is_error, result.text) == (False, "again"), result


@pytest.mark.timeout(60)
def test_with_republishing_off_a_lost_message_waits_for_its_deadline(
    redis_url: str, runs_file: Path, gateway_on: GatewayOn, worker_on: WorkerOn, broker: redis.Redis,
    settings: Settings,
) -> None:  # fmt: skip
    # Given a gateway told not to republish, and a call whose message was lost
    env = base_env(redis_url, RECORD_RUN_FILE=str(runs_file), UNSTUCK_GATEWAY__REPUBLISH_UNCLAIMED="false")
    gateway = gateway_on(env)
    queue = broker_queue_key(settings.broker.queue)
    call = ToolCall(id="c1", name="record_run", arguments={"tag": "never"})
    thread, results = call_in_thread(gateway, "off", call)
    wait_until(lambda: broker.llen(queue) == 1, timeout_s=10, what="the call's message in the queue")
    assert broker.delete(queue) == 1
    # When a worker comes up afterwards
    worker_on(env)
    thread.join(timeout=40)
    # Then nothing runs it: the call is answered at its deadline, as before the rule existed
    assert [r.reason for r in results] == ["deadline_exceeded"]
    assert _runs(runs_file) == []


@pytest.mark.timeout(60)
def test_a_message_a_worker_takes_after_its_calls_deadline_runs_nothing(
    gateway: ToolGateway, env: dict[str, str], worker_on: WorkerOn, runs_file: Path
) -> None:
    # Given a registered call past its deadline that nobody answered yet (its gateway died,
    # the watchdog has not swept), and its message, without Celery's own expiry, queued
    ledger = gateway._rt.ledger
    keys = ledger.keys("expired", "r")
    now = int(time.time() * 1000)
    registered = CallJob.model_validate({
        "session_key": "expired", "run_id": "r",
        "call": {"id": "late", "name": "record_run", "arguments": {"tag": "late"}},
        "submitted_ms": now - 9_000, "deadline_ms": now - 1_000, "soft_s": 5, "hard_s": 6,
    })  # fmt: skip
    job = registered.model_dump(mode="json")  # the message carries the registered form
    fields = {**registration_fields(registered), "dispatched": "1"}
    ledger.register(keys, "late", now_ms=now - 9_000, deadline_ms=now - 1_000, fields=fields)
    send_by_hand(
        gateway._app, INVOKE_TASK, kwargs={"job": job}, task_id="late-0", queue=gateway.settings.broker.queue
    )
    # When a worker takes it
    worker = worker_on(env)
    wait_until(lambda: task_outcome(worker.log(), "late-0") is not None, timeout_s=20, what="the task's end")
    # Then the tool never ran and the call was never claimed: its answer is the gateway's or the watchdog's
    assert task_outcome(worker.log(), "late-0") == "ignored"
    assert _runs(runs_file) == []
    record = ledger.record(keys, "late")
    assert record is not None
    assert record.row.integer(CallField.ATTEMPT) == 0, record
