# GENERATED from workers/store/_async/replica_sends.py by dev/unasync.py: do not edit
"""Sending a deciding write (or a fenced read) until enough replicas hold it: written once.

The rules are :mod:`workers.store.replica_acks`' (its :class:`ReplicaAcks` holds what each
primary was decided to get); this module sends. Written once, for asyncio: its sync twin is
generated from it (``make generate``), so a write costs the same round trips on either client.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.sentinel import SentinelConnectionPool

from workers.store.replica_acks import (
    RESEND_PAUSE_S,
    RESENT_AFTER,
    AckWait,
    ReplicaAcks,
    Seal,
    cluster_confirmed,
    fence,
    no_seal,
    settled_primary,
)

__all__ = ["confirmed", "wait_for"]


def wait_for(acks: ReplicaAcks, client: redis.Redis | RedisCluster) -> AckWait:
    """The WAIT this client's primary gets (``INFO`` read when not decided, or decided a while ago).

    Through the Sentinels it asks them for the primary before and after the INFO: a
    connection opened before a failover stays on the old primary, and one stopped
    (SIGSTOP, an isolated host) and resumed answers as a primary without a replica until
    the Sentinels demote it. Its INFO would decide "no replica, no WAIT", and what it
    then takes is discarded when it resyncs from the promoted one. Asking drops the
    pool's idle connections to a primary the Sentinels no longer name; asking again
    after the reply catches an INFO that waited in a stopped primary while they
    promoted another, and reads the INFO of that one instead. An INFO that lists no
    replica at all is trusted only while the Sentinels hold that primary settled
    (:func:`~workers.store.replica_acks.settled_primary`).
    """
    if isinstance(client, RedisCluster):  # each node is decided apart (cluster_confirmed)
        return AckWait(0, acks.timeout_ms)
    if not acks.stale() or acks.wanted == 0:
        return acks.decide(dict)
    pool = getattr(client, "connection_pool", None)
    if not isinstance(pool, SentinelConnectionPool):
        found: Mapping[str, Any] = client.info()
        return acks.decide(lambda: found)
    named = pool.get_master_address()  # type: ignore[no-untyped-call]
    found = client.info()
    now_named = pool.get_master_address()  # type: ignore[no-untyped-call]
    if now_named != named:
        found = client.info()
    held_primary = True
    if acks.asks_sentinels(found):
        states = []
        for sentinel in pool.sentinel_manager.sentinels:
            with contextlib.suppress(redis.RedisError):
                states.append(sentinel.sentinel_master(pool.service_name))
        held_primary = settled_primary(states, now_named)
    return acks.decide(lambda: found, settled=lambda: held_primary)


def confirmed(
    acks: ReplicaAcks,
    client: redis.Redis | RedisCluster,
    send: Callable[[Seal], list[Any]],
    *,
    read: bool = False,
    slot_key: str | None = None,
) -> list[Any]:
    """``send(seal)`` until its WAIT holds; the replies before the WAIT.

    ``send`` sends one pipeline, ``seal`` adding the WAIT last (so on the same connection).
    ``read``: the pipeline only reads, and ``seal`` is a fence (a ``PUBLISH``, then the WAIT).
    ``slot_key``: a key of the slot the pipeline decides or reads, which a cluster client
    fences after it (:mod:`workers.store.replica_acks`); required there, unused elsewhere.
    """
    if isinstance(client, RedisCluster):
        return cluster_confirmed(acks, client, send, slot_key)
    try:
        first: AckWait | None = wait_for(acks, client)
    except RESENT_AFTER:
        if not acks.may_move(client):
            raise
        first = None  # no primary answers yet: decided in the loop, once one does
    if first is not None and first.acks <= 0:  # a lone Redis: no WAIT, errors raised as they come
        return send(no_seal)
    started = acks.clock()
    while True:
        try:
            wait = wait_for(acks, client)  # decided again after a short WAIT (see short)
            if wait.acks <= 0:
                return send(no_seal)
            replies = send(functools.partial(fence, wait) if read else wait.seal)
        except RESENT_AFTER as exc:
            acks.short(started, exc)
            time.sleep(RESEND_PAUSE_S)
            continue
        if wait.held(replies[-1]):
            return replies[: -2 if read else -1]
        acks.short(started, None)
