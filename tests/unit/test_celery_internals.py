"""The Celery and kombu internals unstuck still leans on exist, with the shapes it calls.

Each is listed, with its reason, in docs/architecture.md and ``workers.celery_edge``'s
docstring; the integration tests named there pin the behaviour. This test fails first, and
says which, when a Celery or kombu release renames or drops one of them.
"""

from __future__ import annotations

import inspect

import kombu.transport
from celery.events.dispatcher import EventDispatcher
from celery.worker.consumer import Consumer
from celery.worker.consumer.events import Events
from kombu.transport import redis as kombu_redis


def _params(func: object) -> list[str]:
    return list(inspect.signature(func).parameters)  # type: ignore[arg-type]


def test_consumer_hooks_of_refusing_consumer() -> None:
    assert _params(Consumer.create_task_handler)[:1] == ["self"]
    assert _params(Consumer.on_decode_error) == ["self", "message", "exc"]
    assert _params(Consumer.on_invalid_task) == ["self", "body", "message", "exc"]
    assert _params(Consumer.ensure_connected) == ["self", "conn"]
    # Its task events: the Events step hands the dispatcher the consumer's buffered-event hook.
    assert _params(Consumer.on_send_event_buffered) == ["self"]
    for hook in (Consumer.on_close, Consumer.stop, Consumer.shutdown):
        assert _params(hook) == ["self"]
    assert "on_send_buffered=c.on_send_event_buffered" in inspect.getsource(Events.start)
    assert "on_send_buffered" in _params(EventDispatcher.__init__)
    assert callable(EventDispatcher.flush)


def test_sentinel_internals_of_the_primary_following_transport() -> None:
    assert callable(vars(kombu_redis.SentinelChannel)["_sentinel_managed_pool"])
    assert isinstance(kombu.transport.__dict__["_transport_cache"], dict)
    assert "sentinel" in kombu.transport.TRANSPORT_ALIASES
