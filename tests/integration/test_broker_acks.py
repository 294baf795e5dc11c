"""On a Redis broker, tool workers take messages without kombu's unacked bookkeeping.

kombu tracks each unacknowledged Redis message in ``unacked`` / ``unacked_index`` (two MULTI
round trips per call in the worker's main process); the ledger, not that redelivery, answers
a call whose message is lost. kombu's public transport option ``ack_emulation: False`` turns
the bookkeeping off (workers/celery_edge/app_config.py); this test fails if a kombu release
stops honouring it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from tests.harness import Proc
from workers import ToolCall, ToolGateway
from workers.settings import Settings


@pytest.fixture
def broker_key_events(settings: Settings) -> Iterator[Callable[[], list[str]]]:
    """Reads the keyspace events on the broker's ``unacked*`` keys since the test started."""
    client = redis.Redis.from_url(settings.broker_url, decode_responses=True)
    previous = str(client.config_get("notify-keyspace-events")["notify-keyspace-events"])
    client.config_set("notify-keyspace-events", "KA")
    pubsub = client.pubsub()
    pubsub.psubscribe("__keyspace@*__:unacked*")
    assert pubsub.get_message(timeout=5.0)["type"] == "psubscribe"  # listening from here on

    def events() -> list[str]:
        seen = []
        while (message := pubsub.get_message(timeout=0.5)) is not None:
            seen.append(f"{message['channel']} {message['data']}")
        return seen

    yield events
    pubsub.close()
    client.config_set("notify-keyspace-events", previous)
    client.close()


@pytest.mark.timeout(60)
def test_calls_run_without_kombu_unacked_bookkeeping(
    worker: Proc, gateway: ToolGateway, broker_key_events: Callable[[], list[str]]
) -> None:
    # Given a worker on a Redis broker, and the broker's unacked keys watched
    calls = [ToolCall(id=f"c{n}", name="echo", arguments={"text": "x"}) for n in range(5)]
    # When five calls run
    results = gateway.call_tools(session_key="s1", run_id="r1", calls=calls)
    # Then each has its real result, and kombu never wrote an unacked entry for their messages
    assert [r.text for r in results] == ["x"] * 5
    assert broker_key_events() == []
