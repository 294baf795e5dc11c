"""The consumer publishes its task events once per interval, and whenever it stops."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import workers.celery_edge.consumer as consumer_module
from workers.celery_edge.consumer import RefusingConsumer
from workers.settings import Settings


class FakeHub:
    def __init__(self) -> None:
        self.timers: list[tuple[float, Any]] = []
        self.soon: list[Any] = []

    def call_later(self, delay_s: float, callback: Any) -> None:
        self.timers.append((delay_s, callback))

    def call_soon(self, callback: Any) -> None:
        self.soon.append(callback)

    def fire(self) -> None:
        due, self.timers = self.timers, []
        for _, callback in due:
            callback()


class FakeDispatcher:
    def __init__(self, *, fails: bool = False) -> None:
        self.flushes = 0
        self.fails = fails

    def flush(self) -> None:
        self.flushes += 1
        if self.fails:
            raise ConnectionError("broker down")


def _consumer(monkeypatch: pytest.MonkeyPatch, flush_ms: int, dispatcher: Any = None) -> Any:
    settings = Settings.model_validate({"broker": {"task_events_flush_ms": flush_ms}})
    monkeypatch.setattr(consumer_module, "runtime", lambda: SimpleNamespace(settings=settings))
    consumer: Any = object.__new__(RefusingConsumer)  # as far as its event hooks use it
    consumer.hub = FakeHub()
    consumer.event_dispatcher = dispatcher or FakeDispatcher()
    consumer._flush_events_promise = "celery's flush"
    return consumer


def test_events_buffered_within_an_interval_are_flushed_once_at_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumer = _consumer(monkeypatch, 150)
    for _ in range(5):  # received, started, succeeded of calls in a row
        consumer.on_send_event_buffered()
    assert [delay for delay, _ in consumer.hub.timers] == [0.15]
    assert consumer.event_dispatcher.flushes == 0
    consumer.hub.fire()
    assert consumer.event_dispatcher.flushes == 1
    consumer.on_send_event_buffered()  # the next interval starts with the next event
    assert len(consumer.hub.timers) == 1


def test_a_lost_connection_flushes_and_lets_the_restarted_loop_set_its_own_flush(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumer = _consumer(monkeypatch, 60_000)
    consumer.on_send_event_buffered()
    consumer.hub.timers.clear()  # the old loop's timer went with it
    monkeypatch.setattr("celery.worker.consumer.Consumer.on_close", lambda self: None)
    consumer.on_close()
    # What was held went to the dispatcher's publish (re-buffered there if the broker is down,
    # which the restarted Events step carries over)
    assert consumer.event_dispatcher.flushes == 1
    consumer.on_send_event_buffered()
    assert [delay for delay, _ in consumer.hub.timers] == [60.0]


def test_what_is_buffered_is_flushed_when_the_consumer_stops_or_shuts_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumer = _consumer(monkeypatch, 200)
    monkeypatch.setattr("celery.worker.consumer.Consumer.stop", lambda self: None)
    monkeypatch.setattr("celery.worker.consumer.Consumer.shutdown", lambda self: None)
    consumer.on_send_event_buffered()
    consumer.stop()
    consumer.shutdown()
    assert consumer.event_dispatcher.flushes == 2


def test_a_failed_flush_is_logged_and_the_next_event_sets_a_new_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    consumer = _consumer(monkeypatch, 100, FakeDispatcher(fails=True))
    consumer.on_send_event_buffered()
    consumer.hub.fire()
    assert "could not flush task events: broker down" in caplog.text
    consumer.on_send_event_buffered()
    assert len(consumer.hub.timers) == 1


def test_zero_keeps_celerys_flush_on_the_next_loop_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = _consumer(monkeypatch, 0)
    consumer.on_send_event_buffered()
    assert consumer.hub.timers == []
    assert consumer.hub.soon == ["celery's flush"]
