"""Integration fixtures: a private redis-server per session, a flushed database per test.

On the cluster leg (``UNSTUCK_TEST_REDIS=cluster``, see the Makefile's ``test`` target) the
store runs on a private 3-master Redis Cluster instead, and Celery's broker on the single
redis-server (kombu cannot use a cluster): ``redis_url`` is then the cluster's.

A test module that needs other settings overrides ``env`` (requesting this ``env`` to extend
it); ``settings``, ``worker``, ``gateway``, ``agateway`` and ``ledger`` then all follow it.
A module whose tests need several environments starts workers and gateways on each with
``worker_on`` and ``gateway_on``, which stop and close them after the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.harness import (
    CLUSTER_LEG,
    CLUSTER_REQUIRED,
    GatewayOn,
    LocalCluster,
    Proc,
    WorkerOn,
    base_env,
    register_cluster,
    settings_in_env,
    start_worker,
)
from tests.sentinel_harness import LocalSentinels
from tests.signing import SigningFiles, kombu_registry_restored, make_signing_files
from workers.gateway.client import ToolGateway
from workers.local.embedded_redis import EmbeddedRedis
from workers.runtime import open_ledger
from workers.settings import Settings
from workers.store.ledger import Ledger


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
def sentinels() -> Iterator[LocalSentinels]:
    """A primary, its replica and three Sentinels of the test's own (tests/sentinel_harness.py)."""
    topology = LocalSentinels().start()
    yield topology
    topology.close()


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
def worker_on() -> Iterator[WorkerOn]:
    """Starts ``unstuck worker`` on the env given (``start_worker``'s options too); stops them all."""
    procs: list[Proc] = []

    def start(env: dict[str, str], **options: Any) -> Proc:
        procs.append(start_worker(env, **options))
        return procs[-1]

    yield start
    for proc in procs:
        proc.kill()


@pytest.fixture
def worker(env: dict[str, str], worker_on: WorkerOn) -> Proc:
    return worker_on(env)


@pytest.fixture
def gateway(settings: Settings) -> Iterator[ToolGateway]:
    """A gateway on this test's Redis, closed afterwards.

    With ``broker.signing`` on, Celery's setup_security rewrites this process's serializer
    registry; it is put back so the next test's gateway starts from the ordinary one.
    """
    with kombu_registry_restored():
        gw = ToolGateway(settings)
        yield gw
        gw.close()


@pytest.fixture
def gateway_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[GatewayOn]:
    """Builds gateways on the settings of the env given (this process's env becomes it); closes them."""
    gateways: list[ToolGateway] = []

    def build(env: dict[str, str]) -> ToolGateway:
        gateways.append(ToolGateway(settings_in_env(env, monkeypatch)))
        return gateways[-1]

    with kombu_registry_restored():
        yield build
        for gw in gateways:
            gw.close()


@pytest.fixture
async def agateway(settings: Settings) -> AsyncIterator[ToolGateway]:
    """A gateway for async tests: its asyncio client is closed on the test's own loop."""
    gw = ToolGateway(settings)
    yield gw
    await gw.aclose()


@pytest.fixture
def ledger(settings: Settings) -> Iterator[Ledger]:
    """The ledger this test's gateway and worker write, closed afterwards."""
    store = open_ledger(settings)
    yield store
    store.close()


@pytest.fixture
def signing(tmp_path: Path) -> SigningFiles:
    """A key and certificate for ``broker.signing``; ``signing.env()`` turns it on."""
    return make_signing_files(tmp_path / "signing")


@pytest.fixture
def runs_file(tmp_path: Path) -> Path:
    """Where ``record_run`` appends a line per execution (its env var: ``RECORD_RUN_FILE``)."""
    return tmp_path / "runs"
