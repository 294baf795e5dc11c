"""Acknowledged means durable on Redis Cluster: deciding writes count once the slot's replica holds them.

A cluster of 3 primaries with a replica each on loopback. The replica of the primary that
owns the test run's slot is SIGSTOPped to make every WAIT on that primary come back short,
as a replica cut off from it would.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis
from redis.cluster import RedisCluster

from tests.harness import LocalCluster, registration_fields
from workers.core.models import CallJob, ToolCall
from workers.core.results import success_result
from workers.errors import ReplicasBehind
from workers.local.embedded_redis import EmbeddedRedis
from workers.store.connection import connect
from workers.store.keys import replica_fence_key
from workers.store.ledger import Ledger
from workers.store.replica_acks import ReplicaAcks

pytestmark = [pytest.mark.slow]

NOW_MS = 1_800_000_000_000


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    nodes = LocalCluster(3, replicas=1, node_timeout_ms=5000).start(timeout_s=60)
    yield nodes
    nodes.close()


@dataclass
class Shard:
    """The primary that owns the test run's slot, and its replica."""

    primary: EmbeddedRedis
    replica: EmbeddedRedis

    def stop_replica(self) -> None:
        assert self.replica.process is not None
        os.kill(self.replica.process.pid, signal.SIGSTOP)

    def resume_replica(self) -> None:
        assert self.replica.process is not None
        os.kill(self.replica.process.pid, signal.SIGCONT)

    def replica_holds(self, key: str) -> dict[str, str]:
        client = redis.Redis(port=self.replica.port, socket_timeout=2, decode_responses=True)
        try:
            client.execute_command("READONLY")  # type: ignore[no-untyped-call]
            return dict(client.hgetall(key))  # type: ignore[arg-type]
        finally:
            client.close()


def _ledger(cluster: LocalCluster, *, wanted: int | None = None, retry_s: float = 5.0) -> Ledger:
    client = connect(cluster.url, socket_timeout_s=3, socket_connect_timeout_s=1, cluster=True)
    acks = ReplicaAcks(wanted, 200, retry_s)
    return Ledger(client, prefix="unstuck", ttl_s=3600, lease_ttl_ms=10_000, replica_acks=acks)


def _shard_of(cluster: LocalCluster, ledger: Ledger, key: str) -> Shard:
    assert isinstance(ledger.client, RedisCluster)
    owner = ledger.client.get_node_from_key(key)
    primary = next(n for n in cluster.nodes if n.port == owner.port)
    for node in cluster.nodes:
        info = redis.Redis(port=node.port, socket_timeout=1).info("replication")
        if info.get("role") == "slave" and int(info["master_port"]) == primary.port:
            return Shard(primary, node)
    raise AssertionError(f"no replica of {owner.name}")


@pytest.fixture
def ledger(cluster: LocalCluster) -> Iterator[Ledger]:
    for port, role in cluster.roles().items():
        if role == "master":  # a replica refuses FLUSHALL, and follows its primary's
            redis.Redis(port=port, socket_timeout=2).flushall()
    made = _ledger(cluster)
    yield made
    made.client.close()


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


@pytest.mark.timeout(120)
def test_each_deciding_write_returns_only_once_the_slots_replica_holds_it(
    cluster: LocalCluster, ledger: Ledger
) -> None:
    # Given a ledger on the cluster, and the run's replica stopping for a second per write
    keys = ledger.keys("s", "r")
    shard = _shard_of(cluster, ledger, keys.call("c1"))
    result = success_result(ToolCall(id="c1", name="echo"), "x", elapsed_ms=1, attempt=1)
    steps: dict[str, Callable[[], object]] = {
        "register": lambda: _register(ledger),
        "claim": lambda: _claim(ledger),
        "finish": lambda: ledger.finish(keys, result, now_ms=NOW_MS, writer="w1"),
    }  # fmt: skip
    replies: dict[str, object] = {}
    state_on_return: dict[str, str] = {}
    waited_s: dict[str, float] = {}
    for name, step in steps.items():
        shard.stop_replica()
        timer = threading.Timer(1.0, shard.resume_replica)
        timer.start()
        started = time.monotonic()
        # When the step's writes are sent while the replica does not acknowledge
        replies[name] = step()
        waited_s[name] = time.monotonic() - started
        state_on_return[name] = shard.replica_holds(keys.call("c1")).get("state", "")
        timer.join()
    # Then each returned only after the replica came back, holding the write, with the reply of
    # its first sending: sent again, each recognised its own write
    assert replies == {"register": True, "claim": ("claimed", 1), "finish": True}
    assert min(waited_s.values()) >= 0.9
    assert state_on_return == {"register": "pending", "claim": "running", "finish": "done"}
    assert ledger.client.hget(keys.call("c1"), "attempt") == "1"
    assert ledger.late_results(keys, "c1") == []
    # and the replica's acknowledgement was of the slot's fence key, written on the run's node
    assert ledger.client.exists(replica_fence_key(keys.run)) == 1
    assert ledger.replica_acks.fencing


@pytest.mark.timeout(120)
def test_a_write_the_slots_replica_never_acknowledges_is_not_decided(
    cluster: LocalCluster, ledger: Ledger
) -> None:
    # Given a ledger that sends a write again for at most a second, and a registered call
    short = _ledger(cluster, retry_s=1.0)
    keys = short.keys("s", "r")
    assert _register(short)
    shard = _shard_of(cluster, short, keys.call("c1"))
    # When the run's replica stops acknowledging
    shard.stop_replica()
    try:
        result = success_result(ToolCall(id="c1", name="echo"), "x", elapsed_ms=1, attempt=1)
        # Then a result is not treated as delivered, and a read of it is not confirmed
        with pytest.raises(ReplicasBehind, match="not treated as decided"):
            short.finish(keys, result, now_ms=NOW_MS, writer="w1")
        with pytest.raises(ReplicasBehind):
            short.results(keys, ["c1"])
    finally:
        shard.resume_replica()
    # and once it is back, the same finish finds its result delivered, and reads confirm it
    assert short.finish(keys, result, now_ms=NOW_MS, writer="w1")
    assert short.results(keys, ["c1"]) == {"c1": result}
    short.client.close()


def test_min_replica_acks_zero_sends_no_fence_on_the_cluster(cluster: LocalCluster, ledger: Ledger) -> None:
    # Given redis.min_replica_acks 0, and the run's replica stopped
    off = _ledger(cluster, wanted=0)
    keys = off.keys("s", "r")
    shard = _shard_of(cluster, off, keys.call("c1"))
    shard.stop_replica()
    try:
        # Then writes and reads go through at once, and no fence key is written
        started = time.monotonic()
        assert _register(off)
        assert off.results(keys, ["c1"]) == {}
        assert time.monotonic() - started < 0.5
        assert off.client.exists(replica_fence_key(keys.run)) == 0
    finally:
        shard.resume_replica()
        off.client.close()
