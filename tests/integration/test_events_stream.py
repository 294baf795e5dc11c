"""The events stream `unstuck up` follows: every synthetic answer that won, and nothing else."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from workers.core.models import SyntheticReason, ToolCall
from workers.core.results import success_result, synthetic_result
from workers.local.up_events import StreamWatcher
from workers.store.connection import connect
from workers.store.ledger import Ledger


@pytest.fixture
def ledger(redis_url: str) -> Iterator[Ledger]:
    client = connect(redis_url, socket_timeout_s=2, socket_connect_timeout_s=1)
    yield Ledger(client, prefix="unstuck", ttl_s=3600, lease_ttl_ms=10_000)
    client.close()


def test_watcher_sees_each_winning_synthetic_answer_once(ledger: Ledger) -> None:
    # Given a watcher started before anything happened
    watcher = StreamWatcher(ledger)
    assert watcher.poll(block_ms=10) == []
    keys = ledger.keys("s1", "r1")
    crash, ok = ToolCall(id="c1", name="exec"), ToolCall(id="c2", name="echo")
    for call in (crash, ok):
        ledger.register(keys, call.id, now_ms=1, deadline_ms=10_000, fields={"tool": call.name})
    # When one call is answered synthetically (twice: the second loses), the other for real
    ledger.finish(
        keys, synthetic_result(crash, SyntheticReason.CRASHED, elapsed_ms=70, attempt=1), now_ms=2, writer="w"
    )
    ledger.finish(
        keys,
        synthetic_result(crash, SyntheticReason.WORKER_LOST, elapsed_ms=9, attempt=1),
        now_ms=3,
        writer="g",
    )
    ledger.finish(keys, success_result(ok, "fine", elapsed_ms=5, attempt=1), now_ms=4, writer="w")
    # Then exactly one event arrives, with the winner's reason and readable fields
    events = watcher.poll(block_ms=100)
    assert [(e.kind, e.fields["call"], e.fields["reason"]) for e in events] == [
        ("synthetic", "c1", "crashed")
    ]
    assert events[0].fields["session"] == "s1"
    assert events[0].fields["elapsed_s"] == 0.07
    # And nothing is repeated on the next poll; the stream expires like every key
    assert watcher.poll(block_ms=10) == []
    assert ledger.client.ttl("unstuck:events") > 0


def test_watcher_started_later_does_not_replay_history(ledger: Ledger) -> None:
    ledger.publish_event("loop-warning", session="s", count=3)
    watcher = StreamWatcher(ledger)
    ledger.publish_event("loop-critical", session="s", count=5)
    assert [(e.kind, e.fields["count"]) for e in watcher.poll(block_ms=100)] == [("loop-critical", 5)]
