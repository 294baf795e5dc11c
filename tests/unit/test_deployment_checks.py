"""config check names each missing production safeguard: ACL user, TLS off this host, signing."""

from __future__ import annotations

import pytest

from workers.core.deployment_checks import check_deployment, check_endpoint


def _messages(path: str, url: str) -> list[str]:
    return [w.message.split(" ")[0] for w in check_endpoint(path, url)]


@pytest.mark.parametrize(
    ("url", "problems"),
    [
        ("rediss://unstuck:pw@redis.internal:6380/0", []),
        ("redis://unstuck:pw@127.0.0.1:6379/0", []),
        ("redis://unstuck:pw@localhost:6379/0", []),
        ("redis://unstuck:pw@[::1]:6379/0", []),
        ("redis://redis.internal:6379/0", ["no", "redis://"]),
        ("redis://:pw@10.0.0.5:6379/0", ["the", "redis://"]),
        ("rediss://redis.internal:6380/0", ["no"]),
        ("redis://127.0.0.1:6379/0", ["no"]),
        ("amqp://guest@mq.internal:5672//", ["no", "amqp://"]),
        ("amqps://u:p@mq.internal:5671//", []),
        ("unix:///run/redis.sock", ["no"]),
        ("memory://", []),
        ("redis://[::1", ["not"]),  # found by the config fuzz: urlsplit raised
    ],
)
def test_each_endpoint_problem_is_named(url: str, problems: list[str]) -> None:
    assert _messages("unstuck.redis.url", url) == problems


def test_a_plain_url_to_another_host_names_its_tls_scheme() -> None:
    (_, tls) = check_endpoint("unstuck.redis.url", "redis://redis.internal:6379/0")
    assert "use rediss:// (TLS)" in tls.message
    assert str(tls).startswith("unstuck.redis.url: ")


def test_the_embedded_redis_of_unstuck_up_is_not_checked() -> None:
    assert check_deployment(redis_url="", broker_url="", signing_enabled=False) == []


def test_a_deployment_without_signing_is_warned_and_a_separate_broker_is_checked() -> None:
    warnings = check_deployment(
        redis_url="rediss://unstuck:pw@redis.internal:6380/0",
        broker_url="amqp://mq.internal:5672//",
        signing_enabled=False,
    )
    assert [w.path for w in warnings] == [
        "unstuck.broker.url",
        "unstuck.broker.url",
        "unstuck.broker.signing",
    ]
    assert "deploy/signing.md" in warnings[-1].message


def test_a_safe_deployment_has_no_warning() -> None:
    url = "rediss://unstuck:pw@redis.internal:6380/0"
    assert check_deployment(redis_url=url, broker_url=url, signing_enabled=True) == []
