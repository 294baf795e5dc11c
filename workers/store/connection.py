"""Opening Redis clients, sync and asyncio, and the one translation of their errors into ``StoreError``.

Every store module raises ``StoreError`` (never a redis-py exception) through
:func:`store_errors`; :func:`connect` and :func:`aconnect` bound every socket wait so no store
call can hang. On a ``sentinel://`` URL the client asks the Sentinels for the primary and
asks again when it moves (redis-py's ``SentinelConnectionPool``): a connection error or a
``READONLY`` reply drops the pool's connections, and the next command goes to the primary
the Sentinels name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import redis
import redis.asyncio as aredis
from redis.asyncio.sentinel import Sentinel as ASentinel
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.cluster import RedisCluster
from redis.connection import SSLConnection
from redis.exceptions import RedisClusterException
from redis.sentinel import Sentinel, SentinelManagedConnection
from redis.sentinel import SentinelConnectionPool as SyncSentinelPool

from workers.core.sentinel_url import SentinelAccess, is_sentinel_url
from workers.errors import StoreError
from workers.store.primary_watch import follow_primary, follow_primary_async
from workers.store.redis_errors import store_error_of

__all__ = ["aconnect", "connect", "store_errors"]

_S = TypeVar("_S", Sentinel, ASentinel)


@contextmanager
def store_errors() -> Iterator[None]:
    """Turn redis-py connection and protocol errors into ``StoreError`` (refusals by cause).

    A cluster client's own failures (no node reachable, a slot no node serves) are not
    ``RedisError``s in redis-py: they are turned too, so none escapes a caller's handling.
    """
    try:
        yield
    except (redis.RedisError, RedisClusterException) as exc:
        raise store_error_of(exc) from exc


def _sentinel_of(url: str, sentinel: SentinelAccess | None) -> SentinelAccess | None:
    """``sentinel`` for a ``sentinel://`` url (refused without it), None for any other url."""
    if not url:
        raise StoreError("no Redis URL configured: set UNSTUCK_REDIS__URL or start `unstuck up`")
    if not is_sentinel_url(url):
        return None
    if sentinel is None:
        raise StoreError(
            "a sentinel:// Redis URL needs redis.sentinel_master (UNSTUCK_REDIS__SENTINEL_MASTER)"
        )
    return sentinel


def _sentinels(cls: type[_S], sentinel: SentinelAccess, timeout_s: float, connect_timeout_s: float) -> _S:
    """redis-py's ``Sentinel`` (sync or asyncio) with the Sentinels' and the primary's options."""
    timeouts = {"socket_timeout": timeout_s, "socket_connect_timeout": connect_timeout_s}
    # One attempt per Sentinel: redis-py asks the next one itself, and its default retry
    # spent 3 s of backoff on a dead Sentinel first in the list before asking the next.
    to_sentinels: dict[str, Any] = {**timeouts, "retry": None}
    if sentinel.sentinel_password:
        to_sentinels["password"] = sentinel.sentinel_password
    to_primary: dict[str, Any] = {**timeouts, "db": sentinel.url.db, "decode_responses": True}
    if sentinel.url.password:
        to_primary["password"] = sentinel.url.password
    if sentinel.url.username:
        to_primary["username"] = sentinel.url.username
    if sentinel.tls:
        to_sentinels["ssl"] = True
        to_primary["ssl"] = True
    found: _S = cls(list(sentinel.url.nodes), sentinel_kwargs=to_sentinels, **to_primary)
    return found


class _WholeReplySentinelConnection(SentinelManagedConnection):
    """redis-py's Sentinel connection, closed when a read is cut short, as a plain one is.

    redis-py's Sentinel connection reads with ``disconnect_on_error=False``, so an interrupt
    raised inside a read (a soft time limit, a cancel: both ``BaseException``) left it open
    with the reply still on its way, and the pool handed it to the next command, which read
    that reply as its own, and every command after it one reply late. A closed connection is
    opened again by its next command.
    """

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        """Read one reply; a read cut short closes the connection (unless a caller says not to)."""
        kwargs.setdefault("disconnect_on_error", True)
        return super().read_response(*args, **kwargs)


class _WholeReplySentinelSSLConnection(_WholeReplySentinelConnection, SSLConnection):
    """The same over TLS."""


def connect(
    url: str,
    *,
    socket_timeout_s: float,
    socket_connect_timeout_s: float,
    cluster: bool = False,
    sentinel: SentinelAccess | None = None,
) -> redis.Redis:
    """A client for ``url`` with bounded timeouts, so no store call can hang a caller.

    With ``cluster`` it is a :class:`~redis.cluster.RedisCluster` that finds every master
    from ``url``'s node. It is typed as ``redis.Redis`` on purpose: the store calls only
    commands both share, each script's keys share one slot (see :mod:`workers.store.keys`),
    and the one place that needs a single node, the sweep's scripts, checks the real class
    (:func:`workers.store.sweep_scripts.server_side_ok`).
    """
    followed = _sentinel_of(url, sentinel)
    if followed is not None:
        sentinels = _sentinels(Sentinel, followed, socket_timeout_s, socket_connect_timeout_s)
        connection_class = _WholeReplySentinelSSLConnection if followed.tls else _WholeReplySentinelConnection
        primary: redis.Redis = sentinels.master_for(
            followed.master, health_check_interval=5, connection_class=connection_class
        )
        follow_primary(cast(SyncSentinelPool, primary.connection_pool), followed.primary_check_interval_s)
        return primary
    if cluster:
        client = RedisCluster.from_url(
            url,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_connect_timeout_s,
            decode_responses=True,
        )
        return cast(redis.Redis, client)
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=socket_connect_timeout_s,
        health_check_interval=5,
        decode_responses=True,
    )


class _BlockingSentinelPool(SentinelConnectionPool, aredis.BlockingConnectionPool):
    """Sentinel's pool (it follows the primary) that waits for a free connection, as below."""


def aconnect(
    url: str,
    *,
    socket_timeout_s: float,
    socket_connect_timeout_s: float,
    max_connections: int,
    sentinel: SentinelAccess | None = None,
) -> aredis.Redis:
    """An asyncio client for ``url`` with bounded timeouts, as :func:`connect` (no cluster).

    Its pool holds at most ``max_connections``; a command finding them all busy waits for one
    (up to the socket timeout) instead of connecting again: under load, connecting is what
    costs the event loop most.
    """
    followed = _sentinel_of(url, sentinel)
    if followed is not None:
        found = _sentinels(ASentinel, followed, socket_timeout_s, socket_connect_timeout_s)
        client: aredis.Redis = found.master_for(
            followed.master,
            connection_pool_class=_BlockingSentinelPool,
            max_connections=max_connections,
            timeout=socket_timeout_s,
            health_check_interval=5,
        )
        follow_primary_async(
            cast(_BlockingSentinelPool, client.connection_pool), followed.primary_check_interval_s
        )
        return client
    pool = aredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=socket_timeout_s,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=socket_connect_timeout_s,
        health_check_interval=5,
        decode_responses=True,
    )
    return aredis.Redis.from_pool(pool)
