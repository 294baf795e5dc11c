"""A consumer that lost its broker tries again within a second, not after kombu's 2, 4, 6 s."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from workers.celery_edge.consumer import RefusingConsumer


class _Connection:
    """Records how the consumer asks it to (re)connect."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []

    def ensure_connection(self, *args: Any, **kwargs: Any) -> _Connection:
        self.asked.append(kwargs)
        return self


def test_the_consumer_reconnects_with_pauses_of_a_second_at_most() -> None:
    # Given a consumer (as Celery sets it up for a reconnection) and its broker connection
    consumer = object.__new__(RefusingConsumer)
    consumer.app = SimpleNamespace(  # type: ignore[assignment]
        conf=SimpleNamespace(
            broker_connection_retry_on_startup=True,
            broker_connection_retry=True,
            broker_connection_max_retries=None,
        )
    )
    consumer.first_connection_attempt = False
    conn = _Connection()
    # When it ensures the connection
    assert consumer.ensure_connected(conn) is conn
    # Then kombu is asked to retry after 0.5 s, then every second
    [asked] = conn.asked
    assert (asked["interval_start"], asked["interval_step"], asked["interval_max"]) == (0.5, 0.5, 1.0)
