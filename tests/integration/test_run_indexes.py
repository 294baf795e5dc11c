"""A run's place in its bucket's run indexes (run_indexes.RunIndexes, run_index.lua)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from tests.harness import store_client
from workers.store.keys import RunKeys, run_member
from workers.store.lua import run_scripts
from workers.store.run_indexes import RunIndexes

T0 = int(time.time() * 1000)
TTL_S = 3600


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = store_client(redis_url)
    yield client
    client.close()


def test_a_run_enters_and_leaves_with_ttls_and_the_ended_index_is_trimmed(client: redis.Redis) -> None:
    # Given an ended member older than the ledger's TTL in the bucket's ended index
    indexes, keys = RunIndexes(client, TTL_S), RunKeys("t", "s", "r1")
    client.zadd(keys.index.ended, {"old/run": T0 - TTL_S * 1000 - 1})
    member = run_member("s", "r1")
    # When the run enters its indexes
    run_scripts(client, [indexes.entering(keys, T0, deadline_ms=T0 + 60_000)])
    # Then it is in both running indexes, each with a TTL
    assert client.zscore(keys.index.by_deadline, member) == T0 + 60_000
    assert client.zscore(keys.index.by_progress, member) == T0
    assert client.ttl(keys.index.by_deadline) > TTL_S
    assert client.ttl(keys.index.by_progress) > TTL_S
    # When it ends (the same process: the running indexes' TTL was refreshed just now)
    run_scripts(client, [indexes.leaving(keys, T0 + 5, ended=True)])
    # Then it left the running indexes for the ended one, which was trimmed and has its TTL
    assert client.zscore(keys.index.by_deadline, member) is None
    assert client.zscore(keys.index.by_progress, member) is None
    assert client.zrange(keys.index.ended, 0, -1) == [member]
    assert client.ttl(keys.index.ended) > TTL_S


def test_a_progress_score_is_never_lowered_by_entering_again(client: redis.Redis) -> None:
    indexes, keys = RunIndexes(client, TTL_S), RunKeys("t", "s", "r1")
    run_scripts(client, [indexes.entering(keys, T0 + 10, deadline_ms=T0 + 60_000)])
    run_scripts(client, [indexes.entering(keys, T0, deadline_ms=T0 + 60_000)])
    assert client.zscore(keys.index.by_progress, run_member("s", "r1")) == T0 + 10
