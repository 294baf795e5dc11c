"""A private redis-server for the loop-history tests: free loopback port, no persistence."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from typing import cast

import pytest
import redis
from redis.cluster import RedisCluster

from tests.harness import CLUSTER_LEG, LocalCluster


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def loop_redis_url() -> Iterator[str]:
    """Start our own redis-server (never the shared one on 6379) and stop it at the end."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = _free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    drain: threading.Thread | None = None
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        # Await the server's own readiness line instead of sleeping; EOF means it died.
        for line in proc.stdout:
            if "Ready to accept connections" in line:
                break
        else:
            pytest.fail(f"redis-server exited with {proc.wait()}")
        # Keep draining the log so the server can never block on a full pipe.
        drain = threading.Thread(target=proc.stdout.read, daemon=True)
        drain.start()
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        assert client.ping()
        client.close()
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if drain is not None:
            drain.join(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def loop_redis(request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    """A client on a flushed database of the private server; on the cluster leg, on the cluster."""
    if CLUSTER_LEG:
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        cluster.flush()
        client: redis.Redis = cast(redis.Redis, RedisCluster.from_url(cluster.url))
    else:
        client = redis.Redis.from_url(request.getfixturevalue("loop_redis_url"))
        client.flushdb()
    yield client
    client.close()
