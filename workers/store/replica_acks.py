"""Acknowledged means durable: a deciding write counts once enough replicas hold it.

Redis replicates asynchronously: a failover discards what the old primary acknowledged but
had not yet sent to a replica. So every script that decides something an agent may be handed
(a registration, a claim, a result) is followed, in the same pipeline and so on the same
connection, by ``WAIT redis.min_replica_acks redis.replica_ack_timeout_ms`` (``WAITAOF 0 n
timeout`` on a Redis that has it and keeps an AOF: the replicas' disks, not only their
memory). The script's reply is returned only when the WAIT came back with enough replicas.

When it comes back short, or the connection fails, the write is **not treated as decided**:
the same script is sent again (through the Sentinels, to whichever server is primary by
then) until its WAIT holds or ``redis.replica_ack_retry_s`` runs out (then
:class:`~workers.errors.ReplicasBehind`). Sending it again re-reads the ledger: each deciding
script recognises its own earlier write (a claim by its nonce, a registration by its nonce,
a result by its writer and bytes) and answers as the first time, and where a failover lost
that write it finds what the new primary holds, which is then what its caller delivers.

A reader confirms what it read the same way (``read=True``): a ``PUBLISH``
(replicated like a write, and nothing listens to it) and the WAIT, behind the reads, in one
pipeline: the WAIT then covers every write the reads saw.

``redis.min_replica_acks`` unset means: 1 when the primary reports a replica in sync
(``state=online`` in ``INFO``; one still loading its first copy acknowledges nothing yet), 0
on a lone Redis, decided at the first deciding write of
the process, again every 5 s, and after every short WAIT or failed connection: a replica promoted while
the old primary is down has no replica of its own and is written as a lone Redis is, until
the old primary comes back as its replica (availability first; ``redis.min_replica_acks`` 1,
and ``min-replicas-to-write`` on the server, refuse writes instead).

On a Redis Cluster each primary is decided apart (its own ``INFO``), and the WAIT cannot
ride in the script's pipeline: redis-py's cluster pipeline sends a command that failed
(a connection error, ``MOVED``) again on its own, on whatever connection, so a WAIT there
may answer for another connection's writes. So the script's pipeline is sent as it is and
followed by a fence on the node it was sent to: a ``SET`` of the slot's fence key
(:func:`~workers.store.keys.replica_fence_key`) and the WAIT, on one connection of that
node. The replication stream is ordered, so a replica holding the fence holds the script's
write; and a fence sent to a node that no longer owns the slot never holds (it is dead,
answers ``MOVED``, or, cut off from the replica promoted in its place, counts no replica),
so a script the cluster client sent elsewhere is sent again rather than trusted.

Through the Sentinels a primary whose ``INFO`` lists no replica at all is taken for a lone
Redis only while it is settled as the primary: every Sentinel that answers names it, none
holds it down and none runs a failover of it. A primary stopped and resumed while the
Sentinels promote its replica is not settled (its writes are discarded when it is demoted):
its deciding writes keep their WAIT, which no replica answers, and are sent again until the
Sentinels name the promoted one. Deciding from ``INFO`` alone there delivered
``worker_lost`` where the ledger kept the tool's result (chaos seed 31). A promoted primary
whose old one is not back as its replica yet is settled: written as a lone Redis, as above.

Through the Sentinels, a process whose first deciding write finds no primary to read ``INFO``
from (the old one dead or stopped, the replica not yet promoted) sends it again like any
other until a primary answers: failing it would answer the call ``dispatch_failed`` with
nothing in the ledger, a delivered result the new primary never holds.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis
import redis.asyncio as aredis
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.cluster import RedisCluster
from redis.exceptions import AskError, ClusterError, RedisClusterException, TryAgainError
from redis.sentinel import SentinelConnectionPool

from workers.errors import ReplicasBehind
from workers.store.keys import replica_fence_key

__all__ = [
    "AckWait",
    "ReplicaAcks",
    "Seal",
    "ack_wait_of",
    "acluster_confirmed",
    "cluster_confirmed",
    "fence",
    "no_seal",
]

log = logging.getLogger(__name__)

#: Where a reader's fence is published: nothing subscribes, the PUBLISH is only replicated.
FENCE_CHANNEL = "unstuck:replica-fence"
#: The pause before a deciding write is sent again after its connection failed.
RESEND_PAUSE_S = 0.1
#: How often an unset redis.min_replica_acks is decided again from INFO: a primary that lost
#: its replica, or a promoted one whose old primary came back as its replica.
_REDECIDE_S = 5.0
#: A replica's line in ``INFO replication`` (``slave0``, ``slave1``, ...).
_REPLICA_FIELD = re.compile(r"slave\d+")
#: WAITAOF came with Redis 7.2.
_WAITAOF_SINCE = (7, 2)
#: The errors after which a deciding write is sent again: no primary, or a demoted one.
RESENT_AFTER = (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError)
#: On a cluster also: the slot moved (MOVED, ASK), is migrating (TRYAGAIN), has no primary
#: (CLUSTERDOWN), or the client cannot reach the cluster or map the slot yet.
RESENT_ON_CLUSTER = (*RESENT_AFTER, ClusterError, AskError, TryAgainError, RedisClusterException)
#: How long a cluster's fence key lives: it only has to reach the replicas.
_FENCE_TTL_MS = 60_000
#: The decision of a client's one primary (every client but a cluster's, whose nodes are named).
_ONE = ""


class _Pipe(Protocol):
    def execute_command(self, *args: Any, **options: Any) -> Any: ...


Seal = Callable[[_Pipe], None]


def no_seal(pipe: _Pipe) -> None:
    """Add nothing: no replica acknowledgement is wanted."""


@dataclass(frozen=True)
class AckWait:
    """The WAIT one Redis gets: how many replicas, how long, and whether it is ``WAITAOF``."""

    acks: int
    timeout_ms: int
    aof: bool = False

    def command(self) -> tuple[Any, ...]:
        """The command that follows a deciding script."""
        if self.aof:
            return ("WAITAOF", 0, self.acks, self.timeout_ms)
        return ("WAIT", self.acks, self.timeout_ms)

    def held(self, reply: Any) -> bool:
        """Whether the WAIT's reply counts enough replicas."""
        count = reply[1] if self.aof else reply
        return int(count) >= self.acks

    def seal(self, pipe: _Pipe) -> None:
        """Add the WAIT behind what ``pipe`` holds."""
        pipe.execute_command(*self.command())


def _version(text: str) -> tuple[int, int]:
    parts = [*text.split("."), "0", "0"][:2]
    try:
        return int(parts[0]), int(parts[1])
    except ValueError:
        return (0, 0)


def _replicas_listed(info: Mapping[str, Any]) -> int:
    """The replicas ``info`` lists, in sync or not."""
    listed = sum(1 for key in info if _REPLICA_FIELD.fullmatch(str(key)))
    return listed or int(info.get("connected_slaves", 0) or 0)


#: A Sentinel's flags on a primary that is not settled as the primary.
_UNSETTLED_FLAGS = frozenset({"s_down", "o_down", "failover_in_progress"})


def settled_primary(states: Iterable[Mapping[str, Any]], node: tuple[str, int]) -> bool:
    """Whether the Sentinels hold ``node`` as the primary: each names it, none holds it down or fails it over.

    ``states``: ``SENTINEL MASTER`` of each Sentinel that answered (none answering: not held).
    """
    answered = False
    for state in states:
        answered = True
        flags = state.get("flags", "")
        names = set(flags.split(",")) if isinstance(flags, str) else set(flags or ())
        if (str(state.get("ip")), int(state.get("port", 0))) != (str(node[0]), int(node[1])):
            return False
        if names & _UNSETTLED_FLAGS:
            return False
    return answered


def _replicas_in_sync(info: Mapping[str, Any]) -> int:
    """The replicas ``info`` lists as ``online``; ``connected_slaves`` where it lists none.

    A replica still loading its first copy (``wait_bgsave``, ``send_bulk``) acknowledges
    nothing until it holds all of it: counting it would make every deciding write wait for
    the whole resync of a restarted replica, or of an old primary rejoining after a failover.
    """
    listed = [value for key, value in info.items() if _REPLICA_FIELD.fullmatch(str(key))]
    if not listed:
        return int(info.get("connected_slaves", 0) or 0)
    # A replica's line is ip, port, state, offset, lag: only its state can read "online".
    return sum(1 for value in listed if isinstance(value, Mapping) and "online" in value.values())


def ack_wait_of(
    info: Mapping[str, Any], *, wanted: int | None, timeout_ms: int, settled: bool = True
) -> AckWait:
    """The WAIT for a primary whose ``INFO`` is ``info``: ``wanted`` acks, else 1 with a replica in sync.

    ``settled``: whether the Sentinels hold it the primary; one that is not and lists no
    replica at all is no lone Redis (see the module docstring).
    """
    expected = _replicas_in_sync(info) or (0 if settled or _replicas_listed(info) else 1)
    acks = wanted if wanted is not None else (1 if expected > 0 else 0)
    aof = (
        str(info.get("aof_enabled", "0")) == "1"
        and _version(str(info.get("redis_version", ""))) >= _WAITAOF_SINCE
    )
    return AckWait(acks, timeout_ms, aof=aof)


@dataclass
class ReplicaAcks:
    """The one place deciding writes wait for replicas (see the module docstring).

    ``wanted`` is ``redis.min_replica_acks`` (None: decide from ``INFO`` at first use).
    """

    wanted: int | None
    timeout_ms: int
    retry_s: float
    clock: Callable[[], float] = time.monotonic
    #: The WAIT each primary gets and when it was decided (``_ONE``, or a cluster node's name).
    _waits: dict[str, tuple[AckWait, float]] = field(default_factory=dict, repr=False)
    _last_warned: float = field(default=float("-inf"), repr=False)

    def stale(self, primary: str = _ONE) -> bool:
        """Whether the WAIT is to be decided (again): never yet, or unset and decided a while ago."""
        held = self._waits.get(primary)
        if held is None:
            return True
        return self.wanted is None and self.clock() - held[1] >= _REDECIDE_S

    def decide(
        self,
        info: Callable[[], Mapping[str, Any]],
        primary: str = _ONE,
        settled: Callable[[], bool] = lambda: True,
    ) -> AckWait:
        """The WAIT ``primary`` gets: held while fresh, else decided from ``info`` (and the Sentinels)."""
        held = self._waits.get(primary)
        if held is not None and not self.stale(primary):
            return held[0]
        before = held[0] if held is not None else None
        if self.wanted == 0:
            wait = AckWait(0, self.timeout_ms)
        else:
            found = info()
            held_primary = settled() if self.asks_sentinels(found) else True
            wait = ack_wait_of(found, wanted=self.wanted, timeout_ms=self.timeout_ms, settled=held_primary)
        self._waits[primary] = (wait, self.clock())
        if wait != before and (before is not None or wait.acks):
            aof = " (WAITAOF)" if wait.aof else ""
            where = f" on {primary}" if primary else ""
            log.info("deciding writes%s wait for %d replica(s)%s", where, wait.acks, aof)
        return wait

    def asks_sentinels(self, info: Mapping[str, Any]) -> bool:
        """Whether a decision from ``info`` needs the Sentinels' word: unset, and no replica listed."""
        return self.wanted is None and _replicas_listed(info) == 0

    def short(self, started: float, error: BaseException | None, primary: str = _ONE) -> None:
        """Raise when the retry budget is spent; else warn (at most every 5 s) and decide again.

        With ``redis.min_replica_acks`` unset the WAIT is decided again from the primary's
        ``INFO`` before the write is sent again: the primary may be another one by now (a
        failover), or one whose replica is gone, which is then written as a lone Redis is.
        """
        held = self._waits.get(primary)
        acks = held[0].acks if held is not None else self.wanted or 1
        now = self.clock()
        why = f"the connection failed ({error})" if error is not None else "its WAIT came back short"
        if now - started >= self.retry_s:
            raise ReplicasBehind(
                f"a deciding write was not acknowledged by {acks} replica(s) within"
                f" redis.replica_ack_retry_s ({self.retry_s:g} s): {why}; not treated as decided"
            ) from error
        if now - self._last_warned >= 5.0:
            self._last_warned = now
            log.warning("a deciding write is sent again: %s (waiting for %d replica(s))", why, acks)
        if self.wanted is None and held is not None:
            # Decided again at the next sending, and meanwhile still known: a reader asks
            # ``fencing`` between sendings, and "never decided" would hand on what a
            # signal carried unconfirmed (chaos seed 31: read from a resumed old primary).
            self._waits[primary] = (held[0], float("-inf"))

    def may_move(self, client: Any) -> bool:
        """Whether a write whose primary cannot be asked yet is sent again rather than failed.

        Through the Sentinels the primary moves: a process whose first deciding write meets
        a dead or stopped primary (before the Sentinels promote the replica) waits for the
        new one as a write already under way does, within ``redis.replica_ack_retry_s``.
        With ``redis.min_replica_acks`` set above 0 the write is to be acknowledged whatever
        the URL. Otherwise (one ``redis://`` server, unset) the error is raised as it comes:
        nobody promotes another server, and the caller answers without the store at once.
        """
        pool = getattr(client, "connection_pool", None)
        return bool(self.wanted) or isinstance(pool, (SentinelConnectionPool, AsyncSentinelPool))

    @property
    def unacknowledged(self) -> bool:
        """Whether the primary is written as a lone Redis now, ``redis.min_replica_acks`` unset.

        Through the Sentinels, what is read then may be on no replica: a deliverer keeps it
        (:mod:`workers.store.kept_answers`).
        """
        held = self._waits.get(_ONE)
        return self.wanted is None and held is not None and held[0].acks <= 0

    @property
    def fencing(self) -> bool:
        """Whether reads are confirmed (known once the first deciding write or read decided it)."""
        return any(wait.acks > 0 for wait, _ in self._waits.values())


def cluster_confirmed(
    acks: ReplicaAcks, client: RedisCluster, send: Callable[[Seal], list[Any]], slot_key: str | None
) -> list[Any]:
    """``confirmed`` on a cluster: the pipeline as it is, then a fence on its slot's node.

    The node is the one the client maps the slot to before the pipeline is sent: a
    pipeline the client sent elsewhere after all (the slot moved meanwhile) leaves a fence
    that cannot hold on this node, and is sent again. A failed fence refreshes the
    client's map of the slots, so the next sending finds the node promoted since.
    """
    if slot_key is None:
        raise ValueError("a deciding write or a fenced read on Redis Cluster names its slot's key")
    if acks.wanted == 0:
        return send(no_seal)
    started, primary = acks.clock(), _ONE
    while True:
        try:
            node = client.get_node_from_key(slot_key)  # type: ignore[no-untyped-call]
            primary, on_node = node.name, client.get_redis_connection(node)
            wait = acks.decide(on_node.info, primary)
            replies = send(no_seal)
            if wait.acks <= 0 or _fence_holds(on_node, slot_key, wait):
                return replies
            error: BaseException | None = None
        except RESENT_ON_CLUSTER as exc:
            error = exc
        acks.short(started, error, primary)
        if error is not None:
            _remap(client)
            time.sleep(RESEND_PAUSE_S)


async def acluster_confirmed(
    acks: ReplicaAcks,
    client: aredis.RedisCluster,
    send: Callable[[Seal], Awaitable[list[Any]]],
    slot_key: str | None,
) -> list[Any]:
    """:func:`cluster_confirmed` on ``redis.asyncio``: sent as it is, with no fence.

    No role decides through an asyncio cluster client (the asyncio gateway waits in threads
    on a cluster): its nodes get no WAIT, as a lone Redis does.
    """
    return await send(no_seal)


def fence(wait: AckWait, pipe: _Pipe) -> None:
    """A reader's fence: a ``PUBLISH`` (replicated, and nobody listens), then the WAIT."""
    pipe.execute_command("PUBLISH", FENCE_CHANNEL, "1")
    wait.seal(pipe)


def _fence_holds(on_node: redis.Redis, slot_key: str, wait: AckWait) -> bool:
    """Whether ``wait`` holds behind a write to ``slot_key``'s fence key, on one connection of the node.

    A ``PUBLISH`` would not do here: a cluster node sends it over the cluster bus, not down
    the replication stream, so it moves no replication offset for the WAIT to wait for.
    """
    pipe = on_node.pipeline(transaction=False)
    pipe.set(replica_fence_key(slot_key), "1", px=_FENCE_TTL_MS)
    wait.seal(pipe)
    return wait.held(pipe.execute()[-1])


def _remap(client: RedisCluster) -> None:
    """Read the cluster's slots again (best effort: the next sending tries again anyway)."""
    try:
        client.nodes_manager.initialize()
    except (redis.RedisError, RedisClusterException):
        log.debug("the cluster's slots could not be read again yet", exc_info=True)
