"""Answers written outside a task close the call's task with Celery events (what Flower reads).

A real Redis broker and Celery's own event receiver: the events are what Flower would get.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

import workers.celery_edge.consumer as consumer_module
from tests.harness import wait_until
from workers.celery_edge.app import create_app
from workers.celery_edge.consumer import RefusingConsumer
from workers.celery_edge.task_events import TaskEvents
from workers.core.models import SyntheticReason, ToolCall
from workers.core.results import synthetic_result
from workers.gateway.client import ToolGateway
from workers.runtime import open_ledger
from workers.settings import Settings
from workers.store.records import CallField


class Captured:
    """Task events seen on the broker, captured by Celery's receiver in a thread."""

    def __init__(self, app: Celery) -> None:
        self.events: list[dict[str, Any]] = []
        self._app = app
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._capture, daemon=True)

    def _capture(self) -> None:
        with self._app.connection_for_read() as conn:
            self._receiver = self._app.events.Receiver(conn, handlers={"*": self.events.append})
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def start(self) -> Captured:
        self._thread.start()
        probe = 0

        def listening() -> bool:
            nonlocal probe
            probe += 1
            with self._app.events.default_dispatcher() as dispatcher:
                dispatcher.send("unstuck-probe", n=probe)
            time.sleep(0.05)
            return any(e["type"] == "unstuck-probe" for e in self.events)

        wait_until(listening, timeout_s=20, interval_s=0.05, what="the event receiver to listen")
        return self

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(timeout=5)

    def of(self, task_id: str) -> list[tuple[str, dict[str, Any]]]:
        return [(e["type"], e) for e in list(self.events) if e.get("uuid") == task_id]


@pytest.fixture
def app(settings: Settings) -> Iterator[Celery]:
    celery = create_app(settings, role="client")
    yield celery
    celery.close()


@pytest.fixture
def captured(app: Celery) -> Iterator[Captured]:
    capture = Captured(app).start()
    yield capture
    capture.stop()


@pytest.mark.timeout(60)
def test_a_call_refused_at_submission_is_received_then_failed_at_once(
    gateway: ToolGateway, captured: Captured
) -> None:
    # When the agent calls a tool that does not exist
    (result,) = gateway.call_tools(
        session_key="ev", run_id="r1", calls=[ToolCall(id="c-unknown", name="ehco", arguments={})]
    )
    assert result.reason == "unknown_tool"
    # Then its task appears (received) and fails at once, under a deterministic id
    task_id = "ev/r1/c-unknown#0"
    wait_until(lambda: len(captured.of(task_id)) == 2, timeout_s=10, what="two events for the call")
    (received_type, received), (failed_type, failed) = captured.of(task_id)
    assert (received_type, failed_type) == ("task-received", "task-failed")
    assert received["name"] == "ehco [ev/r1]"
    assert "'session_key': 'ev'" in received["kwargs"]
    assert failed["exception"].startswith("UnknownTool(\"unknown_tool: Unknown tool: 'ehco'")
    assert "'reason': 'unknown_tool'" in failed["result"]
    assert failed["traceback"] == ""
    # And the events come from the gateway, which answered
    assert failed["hostname"].startswith("unstuck-gateway@")


@pytest.mark.timeout(60)
def test_a_dispatched_call_answered_elsewhere_is_closed_under_its_own_task_id(
    settings: Settings, app: Celery, captured: Captured
) -> None:
    # Given a call registered and dispatched under a task id (no worker runs it here)
    ledger = open_ledger(settings)  # the watchdog's own client, not the gateway's
    keys = ledger.keys("ev", "r2")
    now = int(time.time() * 1000)
    record: dict[str, str] = {
        CallField.TOOL: "echo",
        CallField.DISPATCHED: "1",
        CallField.TASK_ID: "ev/r2/c1#1",
    }
    assert ledger.register(keys, "c1", now_ms=now, deadline_ms=now + 60_000, fields=record)
    events = TaskEvents(app, ledger, role="watchdog").attach()
    # When something outside the task answers it (the watchdog: its worker was lost)
    call = ToolCall(id="c1", name="echo")
    lost = synthetic_result(call, SyntheticReason.WORKER_LOST, elapsed_ms=3000, attempt=1)
    assert ledger.finish(keys, lost, now_ms=now + 3000, writer="test/watchdog")
    assert events.flush(timeout_s=10)
    # Then the task it was dispatched under fails with the reason; no second "received"
    wait_until(lambda: bool(captured.of("ev/r2/c1#1")), timeout_s=10, what="the closing event")
    ((event_type, event),) = captured.of("ev/r2/c1#1")
    assert event_type == "task-failed"
    assert event["exception"].startswith('WorkerLost("worker_lost: ')
    assert event["hostname"].startswith("unstuck-watchdog@")
    events.close(timeout_s=5)
    ledger.close()


@pytest.mark.timeout(60)
def test_queued_events_go_out_together_and_a_dispatched_call_is_shown_sent(
    settings: Settings, app: Celery, captured: Captured
) -> None:
    # Given a sender that waits a long time for more events before publishing
    ledger = open_ledger(settings)
    events = TaskEvents(app, ledger, role="gateway", flush_ms=60_000)
    for n in range(3):
        events.sent({"uuid": f"ev/r5/c{n}#0", "name": "echo [ev/r5]", "retries": 0})
    time.sleep(0.5)  # what must not happen needs a wait: nothing is published before the interval
    assert not captured.of("ev/r5/c0#0")
    # When it is flushed, every queued event is published, in order
    assert events.flush(timeout_s=10)
    wait_until(lambda: bool(captured.of("ev/r5/c2#0")), timeout_s=10, what="the batch")
    sent = [e for e in captured.events if str(e.get("uuid", "")).startswith("ev/r5/")]
    assert [(e["type"], e["uuid"]) for e in sent] == [("task-sent", f"ev/r5/c{n}#0") for n in range(3)]
    assert sent[0]["hostname"].startswith("unstuck-gateway@")
    events.close(timeout_s=5)
    ledger.close()


def test_a_gateway_reports_each_dispatched_call_sent_under_its_task_id_and_name(
    gateway: ToolGateway, captured: Captured
) -> None:
    # No worker here: the call stays queued until the gateway is closed
    ledger = gateway._rt.ledger
    keys = ledger.keys("ev", "r6")
    call = ToolCall(id="c1", name="echo", arguments={"text": "x"})
    job = gateway._dispatcher.job(keys, "main", call, int(time.time() * 1000), None)
    assert gateway._dispatcher.dispatch(keys, job, attempt=0) is None
    assert gateway._task_events.flush(timeout_s=10)
    wait_until(lambda: bool(captured.of("ev/r6/c1#0")), timeout_s=10, what="task-sent")
    ((event_type, event),) = captured.of("ev/r6/c1#0")
    assert event_type == "task-sent"
    assert event["name"] == "echo [ev/r6]"  # the call's name, as the worker's events give it
    assert "kwargs" not in event  # task-received brings them; a late task-sent must not replace them


def test_dispatch_failed_and_cancelled_calls_get_the_events_that_show_them(
    settings: Settings, app: Celery, gateway: ToolGateway
) -> None:
    ledger = gateway._rt.ledger
    keys = ledger.keys("ev", "r3")
    now = int(time.time() * 1000)
    events = TaskEvents(app, ledger, role="gateway")
    for call_id in ("c-pub", "c-cancel"):
        record: dict[str, str] = {
            CallField.TOOL: "echo",
            CallField.DISPATCHED: "1",
            CallField.TASK_ID: f"ev/r3/{call_id}#0",
        }
        assert ledger.register(keys, call_id, now_ms=now, deadline_ms=now + 60_000, fields=record)
    # A publish that failed: no worker ever received it, so it is received and failed here
    failed = synthetic_result(
        ToolCall(id="c-pub", name="echo"), SyntheticReason.DISPATCH_FAILED, elapsed_ms=1, attempt=0
    )
    assert [t for t, _ in events.events_for(keys, failed)] == ["task-received", "task-failed"]
    # A cancelled call is withdrawn, not failed
    cancelled = synthetic_result(
        ToolCall(id="c-cancel", name="echo"), SyntheticReason.CANCELLED, elapsed_ms=1, attempt=0
    )
    ((event_type, fields),) = events.events_for(keys, cancelled)
    assert event_type == "task-revoked"
    assert fields["uuid"] == "ev/r3/c-cancel#0"
    assert fields["exception"].startswith('Cancelled("cancelled: ')


@pytest.mark.timeout(60)
def test_a_broker_that_is_down_costs_events_never_answers(settings: Settings) -> None:
    # Given a gateway whose broker is unreachable (the ledger's Redis is fine)
    dead = settings.model_copy(
        update={"broker": settings.broker.model_copy(update={"url": "redis://127.0.0.1:1/0"})}
    )
    gateway = ToolGateway(dead)
    started = time.monotonic()
    # When a call is refused at submission (its events cannot be sent)
    (result,) = gateway.call_tools(session_key="ev", run_id="r4", calls=[ToolCall(id="c1", name="ehco")])
    answered_s = time.monotonic() - started
    gateway.close()
    # Then the answer is not delayed by the events, and closing waits at most its flush budget
    assert result.reason == "unknown_tool"
    assert answered_s < 1.0
    assert time.monotonic() - started < answered_s + 3.0


def test_a_failing_listener_never_fails_the_stored_answer(gateway: ToolGateway) -> None:
    ledger = open_ledger(gateway.settings)

    def broken(*_: Any) -> None:
        raise RuntimeError("listener bug")

    ledger.on_answered.append(broken)
    keys = ledger.keys("ev", "r5")
    now = int(time.time() * 1000)
    assert ledger.register(keys, "c1", now_ms=now, deadline_ms=now + 60_000, fields={CallField.TOOL: "echo"})
    answer = synthetic_result(
        ToolCall(id="c1", name="echo"), SyntheticReason.CANCELLED, elapsed_ms=1, attempt=0
    )
    assert ledger.finish(keys, answer, now_ms=now + 1, writer="test")
    assert ledger.results(keys, ["c1"]) == {"c1": answer}
    ledger.close()


class TimerHub:
    """The consumer's event loop, as far as its event hooks use it: timers, fired by the test."""

    def __init__(self) -> None:
        self.timers: list[tuple[float, Any]] = []

    def call_later(self, delay_s: float, callback: Any) -> None:
        self.timers.append((delay_s, callback))


@pytest.mark.timeout(60)
def test_celerys_own_dispatcher_publishes_the_worker_events_only_when_the_consumer_flushes(
    settings: Settings, app: Celery, captured: Captured, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pins what RefusingConsumer relies on in Celery's EventDispatcher: events of the buffered
    # "task" group wait in its buffer, ``on_send_buffered`` is called for each, ``flush`` sends them.
    # Given Celery's dispatcher built as the consumer's Events step builds it
    monkeypatch.setattr(consumer_module, "runtime", lambda: SimpleNamespace(settings=settings))
    consumer: Any = object.__new__(RefusingConsumer)
    consumer.hub = TimerHub()
    with app.connection_for_write() as conn:
        dispatcher = app.events.Dispatcher(
            conn,
            hostname="edge-pin@test",
            buffer_group=["task"],
            on_send_buffered=consumer.on_send_event_buffered,
        )
        consumer.event_dispatcher = dispatcher
        # When two task events are sent
        dispatcher.send("task-received", uuid="pin/r/c1#1", name="echo")
        dispatcher.send("task-started", uuid="pin/r/c1#1")
        # Then nothing is published before the consumer's one timer fires
        assert [delay for delay, _ in consumer.hub.timers] == [settings.broker.task_events_flush_ms / 1000]
        time.sleep(0.3)  # what must not happen needs a wait
        assert captured.of("pin/r/c1#1") == []
        consumer.hub.timers[0][1]()
        wait_until(lambda: len(captured.of("pin/r/c1#1")) == 2, timeout_s=10, what="the flushed events")
        assert [kind for kind, _ in captured.of("pin/r/c1#1")] == ["task-received", "task-started"]
        dispatcher.close()
