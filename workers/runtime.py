"""Per-process collaborators built once from Settings: the ledger client and the tool registry."""

from __future__ import annotations

import functools
import os
import socket
import time
from dataclasses import dataclass
from functools import cache

from workers.core.failure_policy import NO_RULES, FailureRules
from workers.settings import Settings, load_settings
from workers.store.connection import aconnect, connect
from workers.store.done_listener import DoneListener
from workers.store.kept_answers import KeptAnswers
from workers.store.ledger import AsyncLedger, Ledger
from workers.store.replica_acks import ReplicaAcks
from workers.tools.loader import load_tools
from workers.tools.registry import ToolSpec

__all__ = ["Runtime", "build_runtime", "now_ms", "open_async_ledger", "open_ledger", "runtime", "worker_id"]

# Connections of an async ledger for short commands (the waiting itself takes one more):
# enough to keep Redis busy, few enough that connecting never dominates the event loop.
_ASYNC_CONNECTIONS = 32
# Its registrations' own connections: one per registration the loop submits at once.
_REGISTERING_CONNECTIONS = 8


def now_ms() -> int:
    """Wall-clock milliseconds: shared across hosts, so deadlines mean the same everywhere."""
    return int(time.time() * 1000)


@cache
def worker_id() -> str:
    """This process's identity in leases and ``writer`` fields (kept: a pool child asks for it often)."""
    return f"{socket.gethostname()}:{os.getpid()}"


os.register_at_fork(after_in_child=worker_id.cache_clear)  # a forked child is another process


@dataclass(frozen=True)
class Runtime:
    """What tasks, request handlers and the gateway need."""

    settings: Settings
    ledger: Ledger
    tools: dict[str, ToolSpec]
    #: ``tools.fallbacks``/``failBranch``/``retry`` as pure rules, built once per process.
    rules: FailureRules = NO_RULES


def _replica_acks(settings: Settings) -> ReplicaAcks:
    """How this process's deciding writes wait for replicas (``redis.min_replica_acks``)."""
    redis = settings.redis
    return ReplicaAcks(redis.min_replica_acks, redis.replica_ack_timeout_ms, redis.replica_ack_retry_s)


#: One keeper of unacknowledged answers per Redis and prefix in a process: its sync and asyncio
#: ledgers hand answers on through the same one (workers.store.kept_answers).
_KEEPERS: dict[tuple[str, str, str], KeptAnswers] = {}


def _kept_answers(settings: Settings) -> KeptAnswers | None:
    """The process's keeper for this Redis through the Sentinels; None for any other URL."""
    redis = settings.redis
    access = redis.sentinel_access()
    if access is None or redis.min_replica_acks is not None:
        return None
    key = (redis.url, redis.sentinel_master, redis.key_prefix)
    if key not in _KEEPERS:
        _KEEPERS[key] = KeptAnswers(
            functools.partial(
                connect,
                redis.url,
                socket_timeout_s=redis.socket_timeout_s,
                socket_connect_timeout_s=redis.socket_connect_timeout_s,
                sentinel=access,
            ),
            prefix=redis.key_prefix,
            ttl_s=settings.ledger.ttl_s,
            interval_s=access.primary_check_interval_s,
        )
    return _KEEPERS[key]


def _forget_keepers_in_child() -> None:
    for keeper in _KEEPERS.values():
        keeper.after_fork_in_child()


os.register_at_fork(after_in_child=_forget_keepers_in_child)


def open_ledger(settings: Settings) -> Ledger:
    """The ledger on the configured Redis, with its timeouts; raises ``StoreError`` without a URL."""
    client = connect(
        settings.redis.url,
        socket_timeout_s=settings.redis.socket_timeout_s,
        socket_connect_timeout_s=settings.redis.socket_connect_timeout_s,
        cluster=settings.redis.cluster,
        sentinel=settings.redis.sentinel_access(),
    )
    ledger = Ledger(
        client,
        prefix=settings.redis.key_prefix,
        ttl_s=settings.ledger.ttl_s,
        lease_ttl_ms=int(settings.lease.ttl_s * 1000),
        replica_acks=_replica_acks(settings),
    )
    ledger.kept = _kept_answers(settings)
    ledger.max_block_s = _longest_block_s(settings.redis.socket_timeout_s)
    return ledger


def _longest_block_s(socket_timeout_s: float) -> float:
    """The longest ``BLPOP`` a client with this socket timeout sends: its reply must come first."""
    return min(1.0, socket_timeout_s / 2)


def open_async_ledger(settings: Settings) -> AsyncLedger:
    """The asyncio ledger for the running event loop (close it with ``await aclose()`` there)."""
    redis = settings.redis
    sentinel = redis.sentinel_access()
    timeouts = {
        "socket_timeout_s": redis.socket_timeout_s,
        "socket_connect_timeout_s": redis.socket_connect_timeout_s,
    }
    quick = aconnect(redis.url, **timeouts, max_connections=_ASYNC_CONNECTIONS, sentinel=sentinel)
    registering = aconnect(redis.url, **timeouts, max_connections=_REGISTERING_CONNECTIONS, sentinel=sentinel)
    blocking = aconnect(redis.url, **timeouts, max_connections=1, sentinel=sentinel)
    listen_s = _longest_block_s(redis.socket_timeout_s)
    listener = DoneListener(
        blocking, quick, prefix=redis.key_prefix, listen_s=listen_s, ttl_s=settings.ledger.ttl_s
    )
    ledger = AsyncLedger(
        quick,
        prefix=redis.key_prefix,
        ttl_s=settings.ledger.ttl_s,
        listener=listener,
        registering=registering,
        lease_ttl_ms=int(settings.lease.ttl_s * 1000),
        replica_acks=_replica_acks(settings),
    )
    ledger.kept = _kept_answers(settings)
    return ledger


def build_runtime(settings: Settings) -> Runtime:
    """Connect to Redis and load every tool module."""
    return Runtime(
        settings=settings,
        ledger=open_ledger(settings),
        tools=load_tools(
            settings.tool_modules, builtins=settings.tools.builtins, upstreams=settings.mcp.upstreams()
        ),
        rules=settings.tools.failure_rules(),
    )


@cache
def runtime() -> Runtime:
    """The process-wide runtime from the environment (built on first use)."""
    return build_runtime(load_settings())
