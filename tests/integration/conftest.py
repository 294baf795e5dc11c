"""Integration fixtures: a private redis-server per session, a flushed database per test.

On the cluster leg (``UNSTUCK_TEST_REDIS=cluster``, see the Makefile's ``test`` target) the
store runs on a private 3-master Redis Cluster instead, and Celery's broker on the single
redis-server (kombu cannot use a cluster): ``redis_url`` is then the cluster's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from tests.harness import (
    CLUSTER_LEG,
    CLUSTER_REQUIRED,
    LocalCluster,
    Proc,
    base_env,
    register_cluster,
    settings_in_env,
    start_worker,
)
from workers.gateway.client import ToolGateway
from workers.local.embedded_redis import EmbeddedRedis
from workers.settings import Settings


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def redis_cluster(redis_server: EmbeddedRedis) -> Iterator[LocalCluster | None]:
    """The cluster leg's Redis Cluster (None on the ordinary leg); CI fails when it cannot start."""
    if not CLUSTER_LEG:
        yield None
        return
    try:
        cluster = LocalCluster().start()
    except Exception as exc:  # noqa: BLE001 - any reason the cluster is missing is reported the same way
        if CLUSTER_REQUIRED:
            pytest.fail(f"the cluster leg needs a Redis Cluster and none started: {exc!r}")
        pytest.skip(f"no Redis Cluster could start: {exc!r}")
    register_cluster(cluster.url, redis_server.url)
    yield cluster
    cluster.close()


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis, redis_cluster: LocalCluster | None) -> str:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    if redis_cluster is not None:
        redis_cluster.flush()
        return redis_cluster.url
    return redis_server.url


@pytest.fixture
def env(redis_url: str) -> dict[str, str]:
    return base_env(redis_url)


@pytest.fixture
def settings(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    return settings_in_env(env, monkeypatch)


@pytest.fixture
def worker(env: dict[str, str]) -> Iterator[Proc]:
    proc = start_worker(env)
    yield proc
    proc.stop()


@pytest.fixture
def gateway(settings: Settings) -> Iterator[ToolGateway]:
    """A gateway on this test's Redis, closed afterwards."""
    gw = ToolGateway(settings)
    yield gw
    gw.close()


@pytest.fixture
async def agateway(settings: Settings) -> AsyncIterator[ToolGateway]:
    """A gateway for async tests: its asyncio client is closed on the test's own loop."""
    gw = ToolGateway(settings)
    yield gw
    await gw.aclose()
