"""How deciding writes wait for replicas: the WAIT chosen from INFO, and when a write counts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel, SentinelConnectionPool

from workers.errors import ReplicasBehind
from workers.store._async.replica_sends import confirmed as aconfirmed
from workers.store._sync.replica_sends import confirmed, wait_for
from workers.store.replica_acks import AckWait, ReplicaAcks, ack_wait_of, settled_primary


@pytest.mark.parametrize(
    ("info", "wanted", "expected"),
    [
        ({"connected_slaves": 0, "redis_version": "7.0.15"}, None, AckWait(0, 100)),
        ({"connected_slaves": 2, "redis_version": "7.0.15"}, None, AckWait(1, 100)),
        ({"connected_slaves": 2, "redis_version": "7.0.15"}, 2, AckWait(2, 100)),
        ({"connected_slaves": 1, "redis_version": "7.0.15"}, 0, AckWait(0, 100)),
        (
            {"connected_slaves": 1, "redis_version": "7.2.4", "aof_enabled": 1},
            None,
            AckWait(1, 100, aof=True),
        ),
        ({"connected_slaves": 1, "redis_version": "7.2.4", "aof_enabled": 0}, None, AckWait(1, 100)),
        ({"connected_slaves": 1, "redis_version": "7.0.15", "aof_enabled": 1}, None, AckWait(1, 100)),
        (
            {"connected_slaves": 1, "slave0": {"state": "wait_bgsave"}, "redis_version": "7.0.15"},
            None,
            AckWait(0, 100),
        ),
        (
            {"connected_slaves": 1, "slave0": {"state": "send_bulk"}, "redis_version": "7.0.15"},
            1,
            AckWait(1, 100),
        ),
        (
            {
                "connected_slaves": 2,
                "slave0": {"state": "send_bulk"},
                "slave1": {"state": "online", "offset": 10},
                "redis_version": "7.0.15",
            },
            None,
            AckWait(1, 100),
        ),
    ],
)
def test_the_wait_follows_the_primary_info(
    info: dict[str, Any], wanted: int | None, expected: AckWait
) -> None:
    assert ack_wait_of(info, wanted=wanted, timeout_ms=100) == expected


def test_waitaof_counts_the_replicas_fsynced() -> None:
    wait = AckWait(1, 100, aof=True)
    assert wait.command() == ("WAITAOF", 0, 1, 100)
    assert wait.held([0, 1])
    assert not wait.held([1, 0])
    assert AckWait(2, 50).command() == ("WAIT", 2, 50)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Client(redis.Redis):
    """Answers INFO only: what ``ReplicaAcks`` asks before its first write."""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas

    def info(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"connected_slaves": self.replicas, "redis_version": "7.0.15"}


def test_a_short_wait_sends_the_write_again_until_it_holds() -> None:
    clock = _Clock()
    acks = ReplicaAcks(None, 100, 5.0, clock=clock)
    sent: list[int] = []

    def send(seal: Any) -> list[Any]:
        sent.append(1)
        clock.now += 0.1
        return ["reply", 0 if len(sent) < 3 else 1]

    assert confirmed(acks, _Client(1), send) == ["reply"]
    assert len(sent) == 3


def test_a_write_still_short_after_the_retry_budget_is_not_decided() -> None:
    clock = _Clock()
    acks = ReplicaAcks(None, 100, 1.0, clock=clock)

    def send(seal: Any) -> list[Any]:
        clock.now += 0.3
        return ["reply", 0]

    with pytest.raises(ReplicasBehind, match=r"1 replica\(s\) within redis.replica_ack_retry_s \(1 s\)"):
        confirmed(acks, _Client(1), send)


def test_a_lone_redis_sends_no_wait() -> None:
    acks = ReplicaAcks(None, 100, 1.0)
    seals: list[Any] = []

    def send(seal: Any) -> list[Any]:
        seals.append(seal)
        return ["reply"]

    assert confirmed(acks, _Client(0), send) == ["reply"]
    assert not acks.fencing


class _Named(SentinelConnectionPool):
    """A pool through Sentinels that name one primary (asked without a Sentinel to ask)."""

    def __init__(self) -> None:
        super().__init__("mymaster", Sentinel([("127.0.0.1", 1)]))  # type: ignore[no-untyped-call]

    def get_master_address(self) -> tuple[str, int]:
        return ("127.0.0.1", 1)


class _AsyncNamed(AsyncSentinelPool):
    """:class:`_Named` on ``redis.asyncio``."""

    def __init__(self) -> None:
        super().__init__("mymaster", AsyncSentinel([("127.0.0.1", 1)]))  # type: ignore[no-untyped-call]

    async def get_master_address(self) -> tuple[str, int]:
        return ("127.0.0.1", 1)


class _MovingClient(_Client):
    """A client through the Sentinels whose primary answers INFO only after ``down`` refusals.

    Each refusal moves ``clock`` on by half a second (a connection attempt and its retries).
    """

    def __init__(self, replicas: int, down: int, clock: _Clock) -> None:
        super().__init__(replicas)
        self.down, self.clock = down, clock
        self.connection_pool = _Named()

    def info(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if self.down > 0:
            self.down -= 1
            self.clock.now += 0.5
            raise redis.ConnectionError("Connection refused")
        return super().info()


def test_a_first_write_through_the_sentinels_waits_for_the_new_primary() -> None:
    # Given a process whose first deciding write meets a dead primary (still named by the Sentinels)
    clock = _Clock()
    acks = ReplicaAcks(None, 100, 5.0, clock=clock)
    client = _MovingClient(1, down=3, clock=clock)
    sent: list[Any] = []

    def send(seal: Any) -> list[Any]:
        sent.append(seal)
        return ["reply", 1]

    # Then it is sent once a primary answers, and waits for its replica as any write does
    assert confirmed(acks, client, send) == ["reply"]
    assert client.down == 0
    assert len(sent) == 1
    assert acks.fencing


def test_a_first_write_through_the_sentinels_is_not_decided_past_the_retry_budget() -> None:
    clock = _Clock()
    acks = ReplicaAcks(None, 100, 1.0, clock=clock)

    with pytest.raises(ReplicasBehind, match="the connection failed"):
        confirmed(acks, _MovingClient(1, down=1000, clock=clock), lambda seal: ["reply", 1])


def test_a_first_write_to_one_unreachable_redis_fails_at_once() -> None:
    # Nobody promotes another server behind a redis:// URL: the caller answers without the store
    clock = _Clock()
    acks = ReplicaAcks(None, 100, 5.0, clock=clock)
    client = _MovingClient(1, down=1, clock=clock)
    client.connection_pool = redis.ConnectionPool()

    with pytest.raises(redis.ConnectionError):
        confirmed(acks, client, lambda seal: ["reply", 1])


class _AsyncMovingClient:
    """:class:`_MovingClient` on ``redis.asyncio``."""

    def __init__(self, down: int, clock: _Clock) -> None:
        self.down, self.clock = down, clock
        self.connection_pool = _AsyncNamed()

    async def info(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if self.down > 0:
            self.down -= 1
            self.clock.now += 0.5
            raise redis.ConnectionError("Connection refused")
        return {"connected_slaves": 1, "redis_version": "7.0.15"}


def test_an_async_first_write_through_the_sentinels_waits_for_the_new_primary() -> None:
    clock = _Clock()
    acks = ReplicaAcks(None, 100, 5.0, clock=clock)
    client = _AsyncMovingClient(down=2, clock=clock)

    async def send(seal: Any) -> list[Any]:
        return ["reply", 1]

    assert asyncio.run(aconfirmed(acks, client, send)) == ["reply"]  # type: ignore[arg-type]
    assert client.down == 0


class _NamingPool(SentinelConnectionPool):
    """Sentinels naming ``named``; asking them moves the client off a primary they no longer name."""

    def __init__(self, client: _FailedOverClient, named: str, flags: str = "master") -> None:
        super().__init__("mymaster", Sentinel([("127.0.0.1", 1)]))  # type: ignore[no-untyped-call]
        self.client, self.named, self.flags = client, named, flags
        self.sentinel_manager.sentinels = [_AskedSentinel(self)]

    def get_master_address(self) -> tuple[str, int]:
        self.client.server = self.named  # the idle connections to another primary are dropped
        return ("127.0.0.1", {"old": 1, "promoted": 2}[self.named])


class _AskedSentinel:
    """A Sentinel answering ``SENTINEL MASTER`` with its pool's primary and flags."""

    def __init__(self, pool: _NamingPool) -> None:
        self.pool = pool

    def sentinel_master(self, service_name: str) -> dict[str, Any]:
        port = {"old": 1, "promoted": 2}[self.pool.named]
        return {"ip": "127.0.0.1", "port": port, "flags": self.pool.flags}


class _FailedOverClient(_Client):
    """Connected to ``server``: each server's replicas as its INFO reports them."""

    def __init__(self, server: str, replicas: dict[str, int]) -> None:
        super().__init__(0)
        self.server, self.replicas_of = server, replicas

    def info(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"connected_slaves": self.replicas_of[self.server], "redis_version": "7.0.15"}


def test_a_decision_through_the_sentinels_reads_the_primary_they_name() -> None:
    # Given a client still connected to an old primary, stopped and resumed: no replica of its
    # own, while the Sentinels name the replica they promoted (its old primary not back yet)
    client = _FailedOverClient("old", {"old": 0, "promoted": 0})
    client.connection_pool = _NamingPool(client, "promoted")
    acks = ReplicaAcks(None, 100, 5.0)
    reached: list[str] = []

    def send(seal: Any) -> list[Any]:
        reached.append(client.server)
        return ["reply"]

    # Then the write goes to the promoted primary, never to the one its resync will wipe
    assert confirmed(acks, client, send) == ["reply"]
    assert reached == ["promoted"]


def test_a_decision_reads_again_when_the_sentinels_promoted_while_its_info_waited() -> None:
    # Given an INFO sent to a stopped primary the Sentinels still name, answered only once it
    # resumes, when they have promoted its replica meanwhile (so it reports no replica)
    client = _FailedOverClient("old", {"old": 0, "promoted": 1})
    pool = _NamingPool(client, "old")
    client.connection_pool = pool
    answer = client.info

    def info(*args: Any, **kwargs: Any) -> dict[str, Any]:
        found = answer()
        pool.named = "promoted"  # promoted while the stopped primary held the INFO
        return found

    client.info = info  # type: ignore[method-assign]
    acks = ReplicaAcks(None, 100, 5.0)
    reached: list[str] = []

    def send(seal: Any) -> list[Any]:
        reached.append(client.server)
        return ["reply", 1]

    # Then the write waits for the promoted primary's replica, on the promoted primary
    assert confirmed(acks, client, send) == ["reply"]
    assert reached == ["promoted"]
    assert acks.fencing


class _NodePipe:
    """A node's pipeline: the fence's SET and WAIT, answered as its node would."""

    def __init__(self, node: _Node) -> None:
        self.node = node
        self.commands: list[tuple[Any, ...]] = []

    def set(self, *args: Any, **kwargs: Any) -> None:
        self.commands.append(("SET", *args))

    def execute_command(self, *args: Any) -> None:
        self.commands.append(args)

    def execute(self) -> list[Any]:
        self.node.fences.append(self.commands)
        if self.node.moved:
            raise redis.exceptions.MovedError("1234 127.0.0.1:2")
        return [True, self.node.acks]


class _Node:
    """A cluster node: its name, its replicas (INFO), what WAIT counts, and whether it lost the slot."""

    def __init__(self, name: str, *, replicas: int = 1, acks: int = 1, moved: bool = False) -> None:
        self.name, self.replicas, self.acks, self.moved = name, replicas, acks, moved
        self.fences: list[list[tuple[Any, ...]]] = []

    def info(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"connected_slaves": self.replicas, "redis_version": "7.0.15"}

    def pipeline(self, transaction: bool = True) -> _NodePipe:
        return _NodePipe(self)


class _Slots:
    def __init__(self, client: _ClusterClient) -> None:
        self.client = client

    def initialize(self) -> None:
        self.client.owners.pop(0)


class _ClusterClient(RedisCluster):
    """A cluster client whose map names ``owners[0]`` for every slot; reading the slots again moves on."""

    def __init__(self, *owners: _Node) -> None:
        self.owners = list(owners)
        self.nodes_manager = _Slots(self)  # type: ignore[assignment]

    def get_node_from_key(self, key: str, replica: bool = False) -> Any:
        return self.owners[0]

    def get_redis_connection(self, node: Any) -> Any:
        return node


def test_a_cluster_write_is_fenced_on_its_slots_node() -> None:
    node = _Node("127.0.0.1:1")
    acks = ReplicaAcks(None, 100, 5.0)
    seals: list[Any] = []

    def send(seal: Any) -> list[Any]:
        seals.append(seal)
        return ["reply"]

    assert confirmed(acks, _ClusterClient(node), send, slot_key="unstuck:{s/r}:call:c1") == ["reply"]
    # The pipeline carries no WAIT of its own; the node gets the slot's fence key, then the WAIT
    assert [seal(_NodePipe(node)) for seal in seals] == [None]
    assert node.fences == [[("SET", "unstuck:{s/r}:replica_fence", "1"), ("WAIT", 1, 100)]]
    assert acks.fencing


def test_a_cluster_fence_on_a_node_that_lost_the_slot_sends_the_write_again() -> None:
    # Given a client whose map still names the old primary, which answers MOVED
    old, promoted = _Node("127.0.0.1:1", moved=True), _Node("127.0.0.1:2")
    clock = _Clock()
    acks = ReplicaAcks(None, 100, 5.0, clock=clock)
    sent: list[int] = []

    def send(seal: Any) -> list[Any]:
        sent.append(1)
        return ["reply"]

    # Then the write is sent again once the map names the promoted primary, and fenced there
    assert confirmed(acks, _ClusterClient(old, promoted), send, slot_key="k:{t}:call:c") == ["reply"]
    assert len(sent) == 2
    assert len(old.fences) == len(promoted.fences) == 1


def test_a_cluster_primary_without_a_replica_is_written_as_a_lone_redis() -> None:
    lone = _Node("127.0.0.1:1", replicas=0)
    acks = ReplicaAcks(None, 100, 5.0)
    assert confirmed(acks, _ClusterClient(lone), lambda seal: ["reply"], slot_key="k:{t}:run") == ["reply"]
    assert lone.fences == []
    assert not acks.fencing


def test_a_cluster_fence_short_past_the_retry_budget_is_not_decided() -> None:
    behind = _Node("127.0.0.1:1", acks=0)
    clock = _Clock()
    acks = ReplicaAcks(None, 100, 1.0, clock=clock)

    def send(seal: Any) -> list[Any]:
        clock.now += 0.3
        return ["reply"]

    with pytest.raises(ReplicasBehind, match="WAIT came back short"):
        confirmed(acks, _ClusterClient(behind, behind), send, slot_key="k:{t}:run")


def test_a_cluster_write_names_its_slot() -> None:
    with pytest.raises(ValueError, match="names its slot's key"):
        confirmed(ReplicaAcks(None, 100, 1.0), _ClusterClient(_Node("n")), lambda seal: ["reply"])


class _Stopped(_Client):
    """A primary named by the Sentinels that stopped answering: its INFO times out."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__(1)
        self.clock = clock
        self.connection_pool = _Named()

    def info(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.clock.now += 0.1
        raise redis.TimeoutError("Timeout reading from socket")


def test_reads_stay_confirmed_while_the_wait_cannot_be_decided_again() -> None:
    # Given a process whose deciding writes wait for a replica
    clock = _Clock()
    acks = ReplicaAcks(None, 100, 0.5, clock=clock)
    assert confirmed(acks, _Client(1), lambda seal: ["reply", 1]) == ["reply"]
    # When its primary stops answering, so that a write's WAIT cannot be decided again
    # before its retry budget is spent (a failover under way)
    clock.now += 6.0  # the decision is due again

    def unsent(seal: Any) -> list[Any]:
        raise AssertionError("not sent without a decided WAIT")

    with pytest.raises(ReplicasBehind):
        confirmed(acks, _Stopped(clock), unsent)
    # Then reads are still confirmed: what a done signal carried is re-read behind a WAIT,
    # never handed on as read from a primary that may be about to lose it
    assert acks.fencing
    # and the WAIT is decided again from the INFO of the primary that answers next
    assert wait_for(acks, _Client(0)).acks == 0
    assert not acks.fencing


def test_a_resumed_primary_the_sentinels_are_failing_over_is_no_lone_redis() -> None:
    # Given a primary stopped and resumed while the Sentinels promote its replica: it lists no
    # replica, and they still name it, with their failover of it under way
    client = _FailedOverClient("old", {"old": 0, "promoted": 0})
    client.connection_pool = _NamingPool(client, "old", flags="master,failover_in_progress")
    # Then its deciding writes keep their WAIT (which no replica answers: sent again until the
    # Sentinels name the promoted one), not written as on a lone Redis and then discarded
    assert wait_for(ReplicaAcks(None, 100, 5.0), client).acks == 1
    # and once they hold it settled (say, its replica died), it is a lone Redis
    client.connection_pool = _NamingPool(client, "old")
    assert wait_for(ReplicaAcks(None, 100, 5.0), client).acks == 0


@pytest.mark.parametrize(
    ("states", "settled"),
    [
        ([{"ip": "10.0.0.1", "port": 6379, "flags": "master"}] * 3, True),
        ([{"ip": "10.0.0.1", "port": 6379, "flags": {"master"}}], True),  # RESP3 parses a set
        ([{"ip": "10.0.0.1", "port": 6379, "flags": "master,failover_in_progress"}], False),
        ([{"ip": "10.0.0.1", "port": 6379, "flags": "master,s_down,o_down"}], False),
        (
            [
                {"ip": "10.0.0.1", "port": 6379, "flags": "master"},
                {"ip": "10.0.0.2", "port": 6379, "flags": "master"},
            ],
            False,
        ),
        ([], False),  # no Sentinel answered: nothing holds it
    ],
)
def test_a_primary_is_settled_when_every_sentinel_that_answers_holds_it(
    states: list[dict[str, Any]], settled: bool
) -> None:
    assert settled_primary(states, ("10.0.0.1", 6379)) is settled
