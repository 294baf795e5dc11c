"""A Redis that refuses writes: every call is still answered, and the log names cause and fix.

READONLY: the gateway pointed at a replica (``replica-read-only yes``). OOM: a Redis at its
``maxmemory`` with ``noeviction``. Neither may hang ``call_tools`` or raise out of it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
import redis

from tests.harness import GatewayOn, base_env, wait_until
from workers import ToolCall
from workers.local.embedded_redis import EmbeddedRedis

ANSWERED_WITHIN_S = 15.0


@pytest.fixture
def replica() -> Iterator[EmbeddedRedis]:
    primary = EmbeddedRedis().start()
    follower = EmbeddedRedis(extra_args=("--replicaof", "127.0.0.1", str(primary.port))).start()
    client = redis.Redis(port=follower.port, decode_responses=True)
    client.config_set("replica-read-only", "yes")
    wait_until(
        lambda: client.info("replication").get("master_link_status") == "up",
        timeout_s=10,
        what="replica link up",
    )
    client.close()
    yield follower
    follower.close()
    primary.close()


def _fill(client: redis.Redis) -> None:
    for i in range(10_000):
        client.set(f"filler:{i}", b"x" * 10_000)


@pytest.fixture
def full_redis() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(extra_args=("--maxmemory", "1mb", "--maxmemory-policy", "noeviction")).start()
    client = redis.Redis(port=server.port)
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):  # fill it until Redis refuses
            _fill(client)
        client.close()
        yield server
    finally:
        server.close()


def _answered_with_an_error(
    gateway_on: GatewayOn, url: str, caplog: pytest.LogCaptureFixture, code: str
) -> None:
    caplog.set_level(logging.WARNING)
    gateway = gateway_on(base_env(url))
    call = ToolCall(id="c1", name="echo", arguments={"text": "hi"})
    started = time.monotonic()
    results = gateway.call_tools(session_key="s1", run_id="r1", calls=[call])
    elapsed = time.monotonic() - started
    assert [r.tool_call_id for r in results] == ["c1"]
    assert results[0].is_error
    assert elapsed < ANSWERED_WITHIN_S
    logged = [r.getMessage() for r in caplog.records]
    assert any(f"({code})" in line and "fix: " in line for line in logged), logged


@pytest.mark.timeout(60)
def test_a_read_only_replica_answers_calls_with_an_error_naming_readonly(
    replica: EmbeddedRedis, gateway_on: GatewayOn, caplog: pytest.LogCaptureFixture
) -> None:
    _answered_with_an_error(gateway_on, replica.url, caplog, "READONLY")


@pytest.mark.timeout(60)
def test_a_redis_out_of_memory_answers_calls_with_an_error_naming_oom(
    full_redis: EmbeddedRedis, gateway_on: GatewayOn, caplog: pytest.LogCaptureFixture
) -> None:
    _answered_with_an_error(gateway_on, full_redis.url, caplog, "OOM")


def test_config_check_warns_about_a_lone_redis_without_aof(replica: EmbeddedRedis) -> None:
    from tests.harness import settings_of
    from workers.cli.config_cmd import redis_report

    # The fixture's primary has a replica; the replica itself has none, and neither has AOF.
    lone, replicas = redis_report(settings_of(base_env(replica.url)))
    assert [w.message.split(":")[0] for w in lone] == [
        "the Redis primary has no replica",
        "the Redis has no AOF (appendonly no)",
    ]
    assert replicas == "the Redis primary has no replica: every answer is lost with its host"
