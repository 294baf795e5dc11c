"""Integration fixtures: a private redis-server per session, a flushed database per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from tests.harness import Proc, base_env, settings_in_env, start_worker
from workers.gateway.client import ToolGateway
from workers.local.embedded_redis import EmbeddedRedis
from workers.settings import Settings


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    yield server
    server.close()


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
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
