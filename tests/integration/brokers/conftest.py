"""The broker layer: the backbone's key paths run once per broker (Redis, RabbitMQ).

RabbitMQ runs in a virtual host of this test run's own (created with ``rabbitmqctl`` and
deleted at the end), so nothing collides with other users of the shared server; where
``rabbitmqctl`` is missing, a uniquely named queue on ``/`` is used and deleted instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from kombu import Connection, Queue

from tests.harness import Proc, base_env, settings_in_env, start_worker
from workers.local.embedded_redis import EmbeddedRedis
from workers.settings import Settings

RABBIT_HOST, RABBIT_PORT = "127.0.0.1", 5672
RUN_TOKEN = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
QUEUE = f"unstuck.test.{RUN_TOKEN}"


@dataclass(frozen=True)
class Broker:
    """One broker under test: its name, URL (empty: the ledger's Redis) and queue."""

    name: str
    url: str
    queue: str = QUEUE

    def down_url(self) -> str:
        """A URL of the same scheme where nothing listens."""
        return "amqp://guest:guest@127.0.0.1:1//" if self.name == "rabbitmq" else "redis://127.0.0.1:1/0"


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _rabbitmqctl(*args: str) -> bool:
    if shutil.which("rabbitmqctl") is None:
        return False
    done = subprocess.run(["rabbitmqctl", *args], capture_output=True, text=True, timeout=60, check=False)
    return done.returncode == 0


@pytest.fixture(scope="session")
def rabbit_url() -> Iterator[str]:
    """An ``amqp://`` URL in a vhost of this run's own; skips where no RabbitMQ is reachable."""
    if not _reachable(RABBIT_HOST, RABBIT_PORT):
        pytest.skip(f"RabbitMQ not reachable on {RABBIT_HOST}:{RABBIT_PORT}: RabbitMQ broker tests skipped")
    vhost = f"unstuck-test-{RUN_TOKEN}"
    own_vhost = _rabbitmqctl("add_vhost", vhost) and _rabbitmqctl(
        "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"
    )
    url = f"amqp://guest:guest@{RABBIT_HOST}:{RABBIT_PORT}/{vhost if own_vhost else ''}"
    yield url
    if own_vhost:
        # Retried: a just-stopped worker's connection can still be closing on the first attempt.
        if not any(_rabbitmqctl("delete_vhost", vhost) for _ in range(3)):
            warnings.warn(
                f"could not delete RabbitMQ vhost {vhost}; remove it with rabbitmqctl", stacklevel=1
            )
        return
    with contextlib.suppress(Exception), Connection(url, connect_timeout=2) as conn:
        for queue in (QUEUE, f"{QUEUE}.idle"):
            with contextlib.suppress(Exception):
                Queue(queue, channel=conn.default_channel).delete()


@pytest.fixture(scope="module", params=["redis", "rabbitmq"])
def broker(request: pytest.FixtureRequest) -> Broker:
    """The broker of this round: Redis (the ledger's own server) or RabbitMQ with quorum queues."""
    if request.param == "rabbitmq":
        return Broker("rabbitmq", request.getfixturevalue("rabbit_url"))
    return Broker("redis", "")


@pytest.fixture(scope="module")
def broker_env(redis_server: EmbeddedRedis, broker: Broker) -> dict[str, str]:
    """Worker environment: the private Redis as ledger, ``broker`` as broker, a unique queue.

    ``exec`` is enabled explicitly (built-ins are off by default): the tests run a command.
    """
    return base_env(
        redis_server.url,
        UNSTUCK_BROKER__URL=broker.url,
        UNSTUCK_BROKER__QUEUE=broker.queue,
        UNSTUCK_TOOLS__BUILTINS="exec",
    )


@pytest.fixture(scope="module")
def broker_worker(broker_env: dict[str, str]) -> Iterator[Proc]:
    """One worker per broker round (tests use unique session keys instead of flushing)."""
    proc = start_worker(broker_env, name=f"brk{os.getpid()}")
    yield proc
    proc.stop()


@pytest.fixture
def broker_settings(broker_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings of this test process matching ``broker_env``."""
    return settings_in_env(broker_env, monkeypatch)
