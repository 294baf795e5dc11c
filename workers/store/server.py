"""Is a Redis server there? The pre-flight check of every process, and the wait for a fresh one."""

from __future__ import annotations

import redis

from workers.core.durability_checks import RedisDurability
from workers.core.sentinel_url import SentinelAccess
from workers.store.connection import connect, store_errors

__all__ = ["PingProbe", "durability_of", "ping_error"]


def ping_error(
    url: str,
    *,
    socket_timeout_s: float,
    socket_connect_timeout_s: float,
    cluster: bool = False,
    sentinel: SentinelAccess | None = None,
) -> str | None:
    """PING the server at ``url`` once: None when it answered, else the failure's class name.

    The name (``ConnectionError``, ``AuthenticationError``, ...) is what an operator needs to
    fix the URL, the password or the server.

    Raises:
        StoreError: when ``url`` is empty (no Redis configured).
    """
    try:
        client = connect(
            url,
            socket_timeout_s=socket_timeout_s,
            socket_connect_timeout_s=socket_connect_timeout_s,
            cluster=cluster,
            sentinel=sentinel,
        )
    except redis.RedisError as exc:  # a cluster client asks its node for the slots at once
        return type(exc).__name__
    try:
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure here is the same answer: not reachable
        return type(exc).__name__
    finally:
        client.close()
    return None


def durability_of(client: redis.Redis) -> RedisDurability:
    """What the server's INFO says about its replicas, AOF and eviction policy.

    Raises:
        StoreError: when Redis does not answer.
    """
    with store_errors():
        replication = client.info("replication")
        persistence = client.info("persistence")
        memory = client.info("memory")
    replicas = replication.get("connected_slaves")
    aof = persistence.get("aof_enabled")
    policy = memory.get("maxmemory_policy")
    return RedisDurability(
        replicas=int(replicas) if replicas is not None else None,
        aof=bool(int(aof)) if aof is not None else None,
        eviction_policy=str(policy) if policy is not None else None,
    )


class PingProbe:
    """Repeated PINGs of a server on a loopback port over one client, until it answers."""

    def __init__(self, port: int, *, connect_timeout_s: float = 0.2, timeout_s: float = 0.5) -> None:
        # RESP2: a fresh connection sends nothing before the PING. With RESP3 it sends HELLO
        # first, and redis-py reads a reply that is not a map (whatever else answered on the
        # port) with an AttributeError, not a RedisError, escaping the probe.
        self._client = redis.Redis(
            port=port, socket_connect_timeout=connect_timeout_s, socket_timeout=timeout_s, protocol=2
        )

    def answers(self) -> bool:
        """Whether the server answered this PING; a Redis failure is False, never an error."""
        try:
            return bool(self._client.ping())
        except redis.RedisError:
            return False

    def close(self) -> None:
        """Release the connection."""
        self._client.close()
