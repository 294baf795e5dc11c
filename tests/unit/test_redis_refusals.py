"""Redis's refusals become our exceptions by cause, each naming the cause and the fix."""

from __future__ import annotations

import logging

import pytest
import redis

from workers.errors import (
    ClusterDown,
    NoReplicas,
    PrimaryDown,
    ReadOnlyRedis,
    RedisLoading,
    RedisOutOfMemory,
    RedisRefused,
    StoreError,
)
from workers.store import redis_errors
from workers.store.connection import store_errors
from workers.store.redis_errors import refusal_of, store_error_of

CASES = [
    (redis.ResponseError("NOREPLICAS Not enough good replicas to write."), NoReplicas, True),
    (redis.exceptions.ReadOnlyError("You can't write against a read only replica."), ReadOnlyRedis, True),
    (redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'."), RedisOutOfMemory, False),
    # What redis-py raises: the code stripped, the class saying it.
    (
        redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
        RedisOutOfMemory,
        False,
    ),
    (redis.exceptions.MasterDownError("Link with MASTER is down"), PrimaryDown, True),
    (redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"), RedisLoading, True),
    (redis.ResponseError("CLUSTERDOWN The cluster is down"), ClusterDown, True),
    (redis.exceptions.ClusterDownError("The cluster is down"), ClusterDown, True),
    (
        redis.ResponseError(
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."
        ),
        PrimaryDown,
        True,
    ),
    # A refusal inside a script: Redis prefixes the script's location.
    (redis.ResponseError("Error in script: @user_script:12: -READONLY You can't write"), ReadOnlyRedis, True),
    (
        redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'. script: abc"),
        RedisOutOfMemory,
        False,
    ),
]


@pytest.mark.parametrize(("exc", "cls", "retryable"), CASES)
def test_each_refusal_maps_to_its_class_with_cause_fix_and_retryable(
    exc: redis.RedisError, cls: type[RedisRefused], retryable: bool
) -> None:
    mapped = store_error_of(exc)
    assert type(mapped) is cls
    assert isinstance(mapped, StoreError)
    assert mapped.retryable is retryable
    assert mapped.cause in str(mapped)
    assert "fix: " in str(mapped)
    assert mapped.fix in str(mapped)


@pytest.mark.parametrize(
    "exc",
    [
        redis.ConnectionError("Connection refused"),
        redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        redis.ResponseError("ERR unknown command 'FOO'"),
        redis.ResponseError("ERR value mentions LOADINGS and BOOMREADONLY"),
    ],
)
def test_other_errors_stay_plain_store_errors(exc: redis.RedisError) -> None:
    assert refusal_of(exc) is None
    mapped = store_error_of(exc)
    assert type(mapped) is StoreError
    assert type(exc).__name__ in str(mapped)


def test_the_store_layer_raises_the_mapped_refusal_and_logs_it(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_errors, "_last_logged", {})  # earlier tests logged it already
    caplog.set_level(logging.ERROR, logger="workers.store.redis_errors")
    with pytest.raises(NoReplicas) as caught, store_errors():
        raise redis.ResponseError("NOREPLICAS Not enough good replicas to write.")
    assert isinstance(caught.value.__cause__, redis.ResponseError)
    assert any(
        "NOREPLICAS" in record.getMessage() and "fix:" in record.getMessage() for record in caplog.records
    )
