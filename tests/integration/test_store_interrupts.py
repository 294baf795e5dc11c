"""An interrupt inside a Redis read never leaves its reply for the next command to read.

A soft time limit or a cancel reaches a pool child as a ``BaseException`` raised wherever the
child is, most often blocked in a read (a deciding write waits up to a second for its
replica). The connection it cuts short must not go back to the pool with that reply still
coming: the next command would read it as its own, and every command after it one reply late.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import pytest
import redis

from tests.sentinel_harness import LocalSentinels
from workers.core.sentinel_url import SentinelAccess, parse_sentinel_url
from workers.local.embedded_redis import EmbeddedRedis
from workers.store.connection import connect


class _Interrupt(BaseException):
    """What a soft time limit or a cancel looks like to the code it interrupts."""


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise _Interrupt


def _client_for(redis_server: EmbeddedRedis, sentinels: LocalSentinels | None) -> redis.Redis:
    if sentinels is None:
        return connect(redis_server.url, socket_timeout_s=3.0, socket_connect_timeout_s=1.0)
    access = SentinelAccess(url=parse_sentinel_url(sentinels.url), master=sentinels.master)
    return connect(sentinels.url, socket_timeout_s=3.0, socket_connect_timeout_s=1.0, sentinel=access)


def _interrupted_read(client: redis.Redis) -> None:
    """A blocking read (BLPOP on an empty list, 1 s) cut short at 0.2 s by a signal."""
    assert threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, _interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(_Interrupt):
            client.blpop(["never-filled"], timeout=1)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("kind", ["redis://", "sentinel://"])
def test_the_command_after_an_interrupted_read_reads_its_own_reply(
    kind: str, redis_server: EmbeddedRedis, request: pytest.FixtureRequest
) -> None:
    # Given a store client (on one Redis, or following the primary the Sentinels name)
    topology = request.getfixturevalue("sentinels") if kind == "sentinel://" else None
    client = _client_for(redis_server, topology)
    key = f"interrupt-{kind[:-3]}"
    # When an interrupt cuts a read short while its reply is still on its way
    _interrupted_read(client)
    # Then the next commands on the same client read their own replies, not the one left behind
    client.set(key, "mine")
    assert client.get(key) == "mine"
    assert client.ping() is True
    client.close()
