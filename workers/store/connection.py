"""Opening a synchronous Redis client, and the one translation of its errors into ``StoreError``.

Every store module raises ``StoreError`` (never a redis-py exception) through
:func:`store_errors`; :func:`connect` bounds every socket wait so no store call can hang.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import redis
from redis.cluster import RedisCluster

from workers.errors import StoreError

__all__ = ["connect", "store_errors"]


@contextmanager
def store_errors() -> Iterator[None]:
    """Turn redis-py connection and protocol errors into ``StoreError``."""
    try:
        yield
    except redis.RedisError as exc:
        raise StoreError(f"redis: {type(exc).__name__}: {exc}") from exc


def connect(
    url: str, *, socket_timeout_s: float, socket_connect_timeout_s: float, cluster: bool = False
) -> redis.Redis:
    """A client for ``url`` with bounded timeouts, so no store call can hang a caller.

    With ``cluster`` it is a :class:`~redis.cluster.RedisCluster` that finds every master
    from ``url``'s node. It is typed as ``redis.Redis`` on purpose: the store calls only
    commands both share, each script's keys share one slot (see :mod:`workers.store.keys`),
    and the one place that needs a single node, the sweep's scripts, checks the real class
    (:func:`workers.store.sweep_scripts.server_side_ok`).
    """
    if not url:
        raise StoreError("no Redis URL configured: set UNSTUCK_REDIS__URL or start `unstuck up`")
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
