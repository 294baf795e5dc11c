"""Leave a demoted primary as soon as the Sentinels name another, not when it finally fails.

redis-py asks the Sentinels where the primary is only when a connection opens. A connection
that stays open keeps talking to the node it opened on. That is right while the node is the
primary, and wrong in the one case a failover leaves behind: a primary stopped or cut off long
enough for the Sentinels to promote its replica, then back. Back, it still answers as a primary
until the Sentinels turn it into a replica, 8-10 s later (Sentinel waits that long before it
reconfigures a node that reports the wrong role). Meanwhile:

* a worker's broker BRPOP on it gets an empty reply every second (the calls are published to
  the new primary), so kombu's check for a silent connection never fires and the worker takes
  nothing until the demotion closes the connection: the chaos soak measured sweeps missing for
  13 s, and first calls answered 8.8-12.4 s after a stop of about 3 s;
* whatever is published on it, and every write on it, is discarded by the demotion.

So every process that reaches Redis through the Sentinels runs one thread that asks them
where the primary is every ``redis.primary_check_interval_ms``. When the answer changes, each
followed pool learns it (redis-py then closes its idle connections to the old node, and each
busy one as it is handed back), and the broker's consumer closes the connections it keeps for
itself (:mod:`workers.celery_edge.sentinel_transport`). An asyncio ledger's pools
(``unstuck serve``, ``unstuck mcp``, asyncio gateways) are followed too: the thread asks their
event loop to look the primary up again (:func:`follow_primary_async`), since an asyncio pool
belongs to its loop.

The ledger never depended on this: its deciding writes wait for a replica that the old node
no longer has, and are sent again (:mod:`workers.store.replica_acks`). This lets them reach
the new primary sooner.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from typing import Any, cast

import redis
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.sentinel import Sentinel, SentinelConnectionPool

__all__ = ["Address", "follow_primary", "follow_primary_async", "primary_moved"]

log = logging.getLogger(__name__)

Address = tuple[str, int]


class _PrimaryWatch:
    """The followed pools of this process and the thread that keeps them on the named primary."""

    def __init__(self) -> None:
        self._pools: weakref.WeakSet[SentinelConnectionPool] = weakref.WeakSet()
        # An asyncio pool, with the loop it belongs to (moved there, never from this thread).
        self._async_pools: weakref.WeakKeyDictionary[AsyncSentinelPool, asyncio.AbstractEventLoop] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._interval_s: float | None = None
        self._thread_pid: int | None = None
        # The watch asks through Sentinel clients of its own: a pool's may have been closed by
        # its owner (kombu closes a channel's), and asking through it would open sockets again
        # that nobody closes. These close when no followed pool asks those Sentinels any more.
        self._askers: dict[tuple[object, ...], Sentinel] = {}

    def follow(self, pool: SentinelConnectionPool, interval_s: float) -> None:
        with self._lock:
            self._pools.add(pool)
            self._interval_s = interval_s if self._interval_s is None else min(self._interval_s, interval_s)
            self._start()

    def follow_async(
        self, pool: AsyncSentinelPool, loop: asyncio.AbstractEventLoop, interval_s: float
    ) -> None:
        with self._lock:
            self._async_pools[pool] = loop
            self._interval_s = interval_s if self._interval_s is None else min(self._interval_s, interval_s)
            self._start()

    def _start(self) -> None:
        if self._thread_pid != os.getpid():
            self._thread_pid = os.getpid()
            thread = threading.Thread(target=self._run, name="unstuck-primary-watch", daemon=True)
            thread.start()

    def after_fork_in_child(self) -> None:
        """A thread does not survive a fork: a pool child watches the pools it inherited itself."""
        self._lock = threading.Lock()  # the parent's thread may have held it at the fork
        self._async_pools.clear()  # the parent's event loops do not run in a child
        if len(self._pools):
            self._start()

    def _run(self) -> None:
        while True:  # a daemon thread: it ends with its process
            time.sleep(self._interval_s or 0.5)
            self.check()

    def check(self) -> None:
        """Ask each set of Sentinels once; move every pool whose primary is another node now."""
        with self._lock:
            pools: list[Any] = [*self._pools, *self._async_pools.keys()]
            loops = dict(self._async_pools.items())
        groups: dict[tuple[object, ...], list[Any]] = {}
        for pool in pools:
            groups.setdefault(_followed(pool), []).append(pool)
        for key in set(self._askers) - set(groups):  # no pool follows those Sentinels any more
            for client in self._askers.pop(key).sentinels:
                client.close()
        for key, group in groups.items():
            asker = self._askers.get(key) or self._askers.setdefault(key, _asker(group[0]))
            try:
                named = _address(asker.discover_master(group[0].service_name))
            except redis.RedisError:
                continue  # no Sentinel answers, or none names a primary: nothing to move to yet
            for pool in group:
                if pool.master_address is None or _address(pool.master_address) == named:
                    continue
                if isinstance(pool, AsyncSentinelPool):
                    _move_async(pool, loops.get(pool))
                else:
                    _move(pool)


def _followed(pool: Any) -> tuple[object, ...]:
    """What a pool follows: its primary's name and the Sentinels it asks (the broker's may differ)."""
    sentinels = sorted(
        (
            str(c.connection_pool.connection_kwargs.get("host")),
            int(c.connection_pool.connection_kwargs.get("port", 0)),
        )
        for c in pool.sentinel_manager.sentinels
    )
    return (pool.service_name, *sentinels)


def _asker(pool: Any) -> Sentinel:
    """A Sentinel client of the watch's own, asking the Sentinels ``pool`` asks, as it asks them."""
    manager = pool.sentinel_manager
    nodes = cast(list[tuple[str, int]], list(_followed(pool)[1:]))
    return Sentinel(
        nodes, min_other_sentinels=manager.min_other_sentinels, sentinel_kwargs=manager.sentinel_kwargs
    )


def _address(address: Any) -> Address:
    host, port = address
    return (str(host), int(port))


def _move(pool: SentinelConnectionPool) -> None:
    old = pool.master_address
    try:
        new = pool.get_master_address()  # type: ignore[no-untyped-call]  # closes the pool's idle connections to the old node
    except redis.RedisError:
        return
    log.warning("Redis primary moved from %s to %s: leaving the old one", old, new)


def _move_async(pool: AsyncSentinelPool, loop: asyncio.AbstractEventLoop | None) -> None:
    """Have ``pool``'s own loop ask the Sentinels again (which drops its idle connections to the old node)."""
    if loop is None or loop.is_closed():
        return
    old = pool.master_address

    async def move() -> None:
        try:
            new = await pool.get_master_address()  # type: ignore[no-untyped-call]
        except redis.RedisError:
            return
        log.warning("Redis primary moved from %s to %s: leaving the old one (asyncio)", old, new)

    try:
        asyncio.run_coroutine_threadsafe(move(), loop)
    except RuntimeError:  # the loop closed meanwhile: nothing of it is left to move
        return


def primary_moved(pool: object, host: object, port: object) -> bool:
    """Whether a connection to ``host``:``port`` of ``pool`` talks to a node that is no longer the primary.

    False for a pool that follows no Sentinels, or before it has found a primary at all.
    """
    if not isinstance(pool, SentinelConnectionPool) or not pool.is_master or pool.master_address is None:
        return False
    return _address(pool.master_address) != _address((host, port))


_WATCH = _PrimaryWatch()
os.register_at_fork(after_in_child=_WATCH.after_fork_in_child)


def follow_primary(pool: SentinelConnectionPool, interval_s: float) -> None:
    """Keep ``pool`` on the primary the Sentinels name, checked every ``interval_s`` by this process."""
    _WATCH.follow(pool, interval_s)


def follow_primary_async(pool: AsyncSentinelPool, interval_s: float) -> None:
    """:func:`follow_primary` for an asyncio pool of the running loop (none running: not followed)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    _WATCH.follow_async(pool, loop, interval_s)
