"""The store's pipelines without a transaction: redis-py's, or a lean one on a single-node sync client.

Why a lean one: each call's claim and answer are one pipelined round trip in the worker's pool
child, and redis-py 8's ``Pipeline.execute`` spends most of that round trip's CPU around the
socket (its observability hooks, HIMPORT bookkeeping, a retry wrapper, an encoder call per
argument). On 2026-12-07 a claim-sized pipeline (an ``EVALSHA`` of 10 arguments and a ``ZREM``)
cost 71-76 µs of CPU through it and 40-44 µs here, each with its pool's ``get_connection`` and
``release`` (docs/performance.md, "Lean round trips"). Under load the child's CPU per call
is much of what bounds throughput against bare Celery.

The lean pipeline keeps what the store relies on, through redis-py's public API:

* on a plain pool, each thread that finds it free uses one connection this process keeps out of
  the pool (the pool's own bookkeeping, a fork check and a poll per borrow, was a third of the
  round trip's CPU under load); other threads, and any other pool, borrow and hand back, so a
  Sentinel pool still drops a connection to a demoted primary as it is handed back. A forked
  child keeps none of its parent's;
* arguments are packed by hiredis (a dependency: ``redis[hiredis]``); one it cannot pack (a
  ``bool``, ``None``) sends the commands through redis-py's pipeline, which refuses it its way;
* every reply is read (the connection never goes back with a reply on it) and parsed by the
  client's ``parse_response``, so response callbacks and decoding are redis-py's; error replies
  are returned or raised as redis-py's pipeline does;
* a lost or timed-out connection is closed, and the commands are sent again through redis-py's
  pipeline, whose retry policy then applies: what redis-py's own retry would have done;
* anything raised while reading (a soft time limit, a cancel) closes the connection first.

A cluster client, and every asyncio client, gets redis-py's pipeline.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Literal

import hiredis
import redis
import redis.asyncio as aredis
from redis.client import Pipeline
from redis.cluster import ClusterPipeline, RedisCluster
from redis.commands.core import CoreCommands
from redis.connection import ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["LeanPipeline", "SyncPipe", "apipeline", "pipeline"]

_Command = tuple[tuple[Any, ...], dict[str, Any]]


class LeanPipeline(CoreCommands):
    """Commands queued by redis-py's command methods, sent on one pooled connection at ``execute``."""

    # What redis-py's command mixins ask of the object they queue on (redis.typing): a sync
    # client's marker, and an event dispatcher none of the commands queued here uses.
    _is_async_client: Literal[False] = False
    _event_dispatcher: Any = None

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._commands: list[_Command] = []

    def execute_command(self, *args: Any, **options: Any) -> LeanPipeline:
        """Queue one command (what redis-py's command methods call)."""
        self._commands.append((args, options))
        return self

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send every queued command in one write; their replies, in order (see the module)."""
        if not self._commands:
            return []
        try:
            packed = b"".join([hiredis.pack_command(_words(args)) for args, _ in self._commands])
        except TypeError:
            return self._through_redis_py(raise_on_error)
        pool = self._client.connection_pool
        held = _held(pool)
        if held is not None and held.lock.acquire(blocking=False):
            try:
                if held.conn is None:
                    held.conn = pool.get_connection()
                return self._on(held.conn, packed, raise_on_error)
            finally:
                held.lock.release()
        conn = pool.get_connection()
        try:
            return self._on(conn, packed, raise_on_error)
        finally:
            pool.release(conn)

    def _on(self, conn: Any, packed: bytes, raise_on_error: bool) -> list[Any]:
        """Send ``packed`` on ``conn`` and read every reply; redis-py's pipeline after a lost connection."""
        try:
            conn.send_packed_command([packed])
            replies = [self._reply(conn, args[0], options) for args, options in self._commands]
        except (RedisConnectionError, RedisTimeoutError):
            conn.disconnect()
            return self._through_redis_py(raise_on_error)
        except BaseException:
            conn.disconnect()  # replies may still be on their way: nobody else may read them
            raise
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, ResponseError):
                    raise reply
        return replies

    def _reply(self, conn: Any, name: Any, options: dict[str, Any]) -> Any:
        try:
            return self._client.parse_response(conn, name, **options)  # type: ignore[no-untyped-call]
        except ResponseError as exc:
            return exc

    def _through_redis_py(self, raise_on_error: bool) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for args, options in self._commands:
            pipe.execute_command(*args, **options)  # type: ignore[no-untyped-call]
        replies: list[Any] = pipe.execute(raise_on_error=raise_on_error)
        return replies


def _words(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A command as Redis reads it: a name of several words (``CLIENT ID``) sent as several arguments.

    redis-py's packer splits it so; its response callbacks still go by the name as written.
    """
    name = args[0]
    return (*name.split(), *args[1:]) if isinstance(name, str) and " " in name else args


class _Held:
    """A connection of a plain pool kept out of it by this process, used by one thread at a time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.conn: Any = None


# By pool: a plain one only. A Sentinel pool drops a connection to a demoted primary as it is
# handed back (workers.store.primary_watch), so its connections are always handed back.
_HELD: weakref.WeakKeyDictionary[ConnectionPool, _Held] = weakref.WeakKeyDictionary()
# A forked child holds nothing of its parent's: the parent's sockets are the parent's.
os.register_at_fork(after_in_child=_HELD.clear)


def _held(pool: object) -> _Held | None:
    """The held connection's slot of a plain pool (None for any other pool)."""
    if type(pool) is not ConnectionPool:
        return None
    return _HELD.get(pool) or _HELD.setdefault(pool, _Held())


SyncPipe = LeanPipeline | Pipeline | ClusterPipeline


def pipeline(client: redis.Redis) -> SyncPipe:
    """A pipeline without a transaction on ``client``: the lean one unless it is a cluster client."""
    if isinstance(client, RedisCluster):
        return client.pipeline(transaction=False)
    return LeanPipeline(client)


def apipeline(client: aredis.Redis) -> aredis.client.Pipeline:
    """The asyncio side's pipeline without a transaction (``pipeline``'s twin in generated code)."""
    return client.pipeline(transaction=False)
