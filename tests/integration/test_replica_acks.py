"""Acknowledged means durable: deciding writes count once a replica holds them (WAIT).

A primary and its replica on loopback. The replica is SIGSTOPped to make every WAIT come
back short, as a replica cut off or a primary isolated from it would.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from tests.harness import registration_fields, wait_until
from workers.core.models import CallJob, ToolCall
from workers.core.results import success_result
from workers.errors import ReplicasBehind
from workers.local.embedded_redis import EmbeddedRedis
from workers.store._sync.replica_sends import wait_for
from workers.store.connection import connect
from workers.store.ledger import Ledger
from workers.store.replica_acks import ReplicaAcks

NOW_MS = 1_800_000_000_000


@dataclass
class Pair:
    primary: EmbeddedRedis
    replica: EmbeddedRedis

    def replica_client(self) -> redis.Redis:
        return redis.Redis(port=self.replica.port, socket_timeout=2, decode_responses=True)

    def stop_replica(self) -> None:
        assert self.replica.process is not None
        os.kill(self.replica.process.pid, signal.SIGSTOP)

    def resume_replica(self) -> None:
        assert self.replica.process is not None
        os.kill(self.replica.process.pid, signal.SIGCONT)


def _in_sync(primary: EmbeddedRedis) -> bool:
    info = redis.Redis(port=primary.port, socket_timeout=1).info("replication")
    return int(info.get("connected_slaves", 0)) == 1 and info["slave0"]["state"] == "online"


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    primary = EmbeddedRedis().start()
    replica = EmbeddedRedis(extra_args=("--replicaof", "127.0.0.1", str(primary.port))).start()
    wait_until(lambda: _in_sync(primary), timeout_s=20, what="the replica in sync")
    yield Pair(primary, replica)
    replica.close()
    primary.close()


@pytest.fixture
def both(pair: Pair) -> Iterator[Pair]:
    """The pair, flushed, its replica running again whatever the test did."""
    redis.Redis(port=pair.primary.port).flushall()
    yield pair
    pair.resume_replica()


def _ledger(url: str, *, wanted: int | None = None, retry_s: float = 5.0) -> Ledger:
    client = connect(url, socket_timeout_s=3, socket_connect_timeout_s=1)
    acks = ReplicaAcks(wanted, 200, retry_s)
    return Ledger(client, prefix="unstuck", ttl_s=3600, lease_ttl_ms=10_000, replica_acks=acks)


def _register(ledger: Ledger, call_id: str = "c1") -> bool:
    job = CallJob(
        session_key="s", run_id="r", call=ToolCall(id=call_id, name="echo", arguments={"text": "x"}),
        submitted_ms=NOW_MS, deadline_ms=NOW_MS + 60_000, soft_s=5, hard_s=6,
    )  # fmt: skip
    keys = ledger.keys("s", "r")
    return ledger.register(
        keys, call_id, now_ms=NOW_MS, deadline_ms=NOW_MS + 60_000, fields=registration_fields(job)
    )


def _claim(ledger: Ledger, call_id: str = "c1") -> tuple[str, int]:
    keys = ledger.keys("s", "r")
    digest = str(ledger.client.hget(keys.call(call_id), "job_digest"))
    claim = ledger.claim(keys, call_id, worker_id="w1", now_ms=NOW_MS, tool="echo", job_digest=digest)
    return claim.status.value, claim.attempt


def _resume_after(pair: Pair, seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, pair.resume_replica)
    timer.start()
    return timer


def test_a_lone_redis_gets_no_wait_and_a_primary_with_a_replica_one(redis_url: str, both: Pair) -> None:
    # Given ledgers with redis.min_replica_acks unset, on a lone Redis and on the pair's primary
    lone, paired = _ledger(redis_url), _ledger(both.primary.url)
    # When each decides a write
    assert _register(lone)
    assert _register(paired)
    # Then the lone Redis is not waited for, the primary with a replica for one replica
    assert wait_for(lone.replica_acks, lone.client).acks == 0
    assert wait_for(paired.replica_acks, paired.client).acks == 1
    assert not lone.replica_acks.fencing
    assert paired.replica_acks.fencing


@pytest.mark.timeout(60)
def test_each_deciding_write_returns_only_once_the_replica_holds_it(both: Pair) -> None:
    # Given a ledger on the primary, and a replica that stops acknowledging for a second per write
    ledger = _ledger(both.primary.url)
    keys = ledger.keys("s", "r")
    replica = both.replica_client()
    result = success_result(ToolCall(id="c1", name="echo"), "x", elapsed_ms=1, attempt=1)
    steps: dict[str, Callable[[], object]] = {
        "register": lambda: _register(ledger),
        "claim": lambda: _claim(ledger),
        "finish": lambda: ledger.finish(keys, result, now_ms=NOW_MS, writer="w1"),
    }  # fmt: skip
    replies: dict[str, object] = {}
    held_on_return: dict[str, dict[Any, Any]] = {}
    waited_s: dict[str, float] = {}
    for name, step in steps.items():
        both.stop_replica()
        timer = _resume_after(both, 1.0)
        started = time.monotonic()
        # When the step's writes are sent while the replica does not acknowledge
        replies[name] = step()
        waited_s[name] = time.monotonic() - started
        # (what the replica holds the moment the step returns)
        held_on_return[name] = replica.hgetall(keys.call("c1"))
        timer.join()
    # Then each returned only after the replica came back, with the reply of its first sending:
    # sent again, each recognised its own write (a registration, the same claim, the same result)
    assert replies == {"register": True, "claim": ("claimed", 1), "finish": True}
    assert min(waited_s.values()) >= 0.9
    assert held_on_return["register"]["state"] == "pending"
    assert held_on_return["claim"]["state"] == "running"
    assert held_on_return["finish"]["state"] == "done"
    # and nothing was written twice: one attempt, no late result, one done signal
    assert ledger.client.hget(keys.call("c1"), "attempt") == "1"
    assert ledger.late_results(keys, "c1") == []
    assert ledger.client.llen(keys.done) == 1


@pytest.mark.timeout(60)
def test_a_write_no_replica_acknowledges_is_not_decided(both: Pair) -> None:
    # Given a ledger on the primary that sends a write again for at most a second
    ledger = _ledger(both.primary.url, retry_s=1.0)
    keys = ledger.keys("s", "r")
    assert _register(ledger)
    # When the replica stops acknowledging
    both.stop_replica()
    # Then a result is not treated as delivered: finish raises, and a read is not confirmed
    result = success_result(ToolCall(id="c1", name="echo"), "x", elapsed_ms=1, attempt=1)
    started = time.monotonic()
    with pytest.raises(ReplicasBehind, match="not treated as decided"):
        ledger.finish(keys, result, now_ms=NOW_MS, writer="w1")
    assert time.monotonic() - started >= 1.0
    with pytest.raises(ReplicasBehind):
        ledger.results(keys, ["c1"])
    # and once the replica is back, the same finish finds its result delivered, and reads confirm it
    both.resume_replica()
    assert ledger.finish(keys, result, now_ms=NOW_MS, writer="w1")
    assert ledger.results(keys, ["c1"]) == {"c1": result}
    assert ledger.late_results(keys, "c1") == []


def test_min_replica_acks_zero_sends_no_wait(both: Pair) -> None:
    # Given redis.min_replica_acks 0 on the primary with a stopped replica
    ledger = _ledger(both.primary.url, wanted=0, retry_s=1.0)
    both.stop_replica()
    # Then writes and reads go through at once
    started = time.monotonic()
    assert _register(ledger)
    assert ledger.results(ledger.keys("s", "r"), ["c1"]) == {}
    assert time.monotonic() - started < 0.5
