"""Redis ACL users and TLS (rediss://): the whole path works, and secrets stay out of logs."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.harness import Proc, base_env, start_worker, wait_until
from workers import ToolCall, ToolGateway
from workers.local.embedded_redis import EmbeddedRedis, find_redis_server, free_port
from workers.settings import Settings

PASSWORD = "s3cret-acl-pw"


@pytest.fixture
def acl_url() -> Iterator[str]:
    server = EmbeddedRedis().start()
    admin = redis.Redis(port=server.port)
    admin.acl_setuser(
        "app", enabled=True, passwords=[f"+{PASSWORD}"], keys=["*"], channels=["*"], commands=["+@all"]
    )
    admin.acl_setuser("default", enabled=False)  # only the app user may connect from here on
    admin.close()
    yield f"redis://app:{PASSWORD}@127.0.0.1:{server.port}/0"
    server.close()


def _run_one_call(url: str, monkeypatch: pytest.MonkeyPatch, **env: str) -> tuple[str, Proc]:
    environment = base_env(url, **env)
    for key, value in environment.items():
        if key.startswith("UNSTUCK_"):
            monkeypatch.setenv(key, value)
    worker = start_worker(environment)
    gateway = ToolGateway(Settings())
    try:
        (result,) = gateway.call_tools(
            session_key="secure", run_id="r", calls=[ToolCall(id="c1", name="echo", arguments={"text": "ok"})]
        )
    finally:
        gateway.close()
    return result.text, worker


@pytest.mark.timeout(90)
def test_acl_user_runs_calls_and_its_password_never_reaches_the_log(
    acl_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a Redis where only an ACL user with a password may connect
    text, worker = _run_one_call(acl_url, monkeypatch)
    try:
        # Then calls work end to end through that user
        assert text == "ok"
        # And the worker's log (which prints its broker URL) never shows the password
        wait_until(lambda: "ready" in worker.log(), timeout_s=5)
        assert PASSWORD not in worker.log()
    finally:
        worker.kill()


@pytest.fixture
def tls_url(tmp_path: Path) -> Iterator[str]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    server = subprocess.Popen(
        [find_redis_server(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
         "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={cert}"
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            if server.poll() is not None:
                pytest.skip("this redis-server cannot serve TLS")
            return False

    wait_until(answers, timeout_s=10, what="TLS redis-server")
    client.close()
    yield url
    server.terminate()
    server.wait(timeout=10)


@pytest.mark.timeout(90)
def test_tls_rediss_url_runs_calls_end_to_end(tls_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    text, worker = _run_one_call(tls_url, monkeypatch)
    worker.kill()
    assert text == "ok"
