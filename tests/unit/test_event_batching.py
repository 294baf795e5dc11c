"""The worker's task events are flushed once per interval, and whenever the consumer stops."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import workers.celery_edge.event_batching as batching
from workers.celery_edge.event_batching import BUFFER_LIMIT, BatchedTaskEvents
from workers.settings import Settings


class FakeHub:
    def __init__(self) -> None:
        self.timers: list[tuple[float, Any]] = []

    def call_later(self, delay_s: float, callback: Any) -> None:
        self.timers.append((delay_s, callback))

    def fire(self) -> None:
        due, self.timers = self.timers, []
        for _, callback in due:
            callback()


class FakeDispatcher:
    def __init__(self) -> None:
        self.flushes = 0
        self.buffer_limit = 24
        self.on_send_buffered: Any = "celery's"

    def flush(self) -> None:
        self.flushes += 1


def _step(monkeypatch: pytest.MonkeyPatch, flush_ms: int) -> tuple[BatchedTaskEvents, Any]:
    settings = Settings.model_validate({"broker": {"task_events_flush_ms": flush_ms}})
    monkeypatch.setattr(batching, "runtime", lambda: SimpleNamespace(settings=settings))
    consumer = SimpleNamespace(hub=FakeHub(), event_dispatcher=FakeDispatcher())
    step = BatchedTaskEvents(consumer)
    step.start(consumer)
    return step, consumer


def test_events_buffered_within_an_interval_are_flushed_once_at_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, consumer = _step(monkeypatch, 150)
    dispatcher = consumer.event_dispatcher
    assert dispatcher.buffer_limit == BUFFER_LIMIT
    for _ in range(5):  # received, started, succeeded of calls in a row
        dispatcher.on_send_buffered()
    assert [delay for delay, _ in consumer.hub.timers] == [0.15]
    assert dispatcher.flushes == 0
    consumer.hub.fire()
    assert dispatcher.flushes == 1
    dispatcher.on_send_buffered()  # the next interval starts with the next event
    assert len(consumer.hub.timers) == 1


def test_what_is_buffered_is_flushed_when_the_consumer_stops_or_shuts_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    step, consumer = _step(monkeypatch, 200)
    consumer.event_dispatcher.on_send_buffered()
    step.stop(consumer)
    step.shutdown(consumer)
    assert consumer.event_dispatcher.flushes == 2


def test_zero_keeps_celerys_flush_on_the_next_loop_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    _, consumer = _step(monkeypatch, 0)
    assert consumer.event_dispatcher.on_send_buffered == "celery's"
    assert consumer.event_dispatcher.buffer_limit == 24
