"""Celery's Sentinel list in redis.url: parsing, settings validation, and what Celery is told."""

from __future__ import annotations

import pytest

from workers.celery_edge.app_config import celery_config
from workers.core.sentinel_url import is_sentinel_url, parse_sentinel_url
from workers.errors import ConfigError, StoreError
from workers.settings import Settings, load_settings
from workers.store.connection import connect

THREE = "sentinel://h1:26379;sentinel://h2:26380;sentinel://h3"


def test_a_list_of_three_sentinels_is_read_with_the_default_port() -> None:
    parsed = parse_sentinel_url(THREE)
    assert parsed.nodes == (("h1", 26379), ("h2", 26380), ("h3", 26379))
    assert (parsed.db, parsed.password, parsed.username) == (0, None, None)


def test_the_primary_password_and_database_come_from_any_part() -> None:
    parsed = parse_sentinel_url("sentinel://:s%40cret@h1:26379/3;sentinel://h2:26379")
    assert (parsed.db, parsed.password) == (3, "s@cret")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sentinel://h1:26379;redis://h2:6379", "mixed schemes"),
        ("sentinel://h1:26379;sentinel://h1:26379", "listed twice"),
        ("sentinel://:a@h1:26379;sentinel://:b@h2:26379", "disagree"),
        ("sentinel://h1:26379/0;sentinel://h2:26379/1", "disagree"),
        ("sentinel://h1:port", "not a number"),
        ("sentinel://h1:26379/x", "must be a number"),
        ("sentinel://h1:26379?master=m", "redis.sentinel_"),
        ("sentinel://", "without a host"),
    ],
)
def test_a_bad_list_is_refused_saying_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_sentinel_url(url)


def test_only_sentinel_urls_are_sentinel_urls() -> None:
    assert is_sentinel_url(THREE)
    assert is_sentinel_url("redis://h:6379;sentinel://h2")  # mixed: refused by the parser
    assert not is_sentinel_url("redis://h:6379/0")
    assert not is_sentinel_url("")


def _problems(**overrides: object) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(**overrides)
    return str(caught.value)


def test_a_sentinel_url_without_sentinel_master_is_refused_naming_the_variable() -> None:
    assert "UNSTUCK_REDIS__SENTINEL_MASTER" in _problems(redis={"url": THREE})


def test_sentinel_master_without_a_sentinel_url_is_refused() -> None:
    assert "not a sentinel:// list" in _problems(redis={"url": "redis://h:6379/0", "sentinel_master": "m"})


def test_mixed_schemes_are_refused_at_load() -> None:
    assert "mixed schemes" in _problems(redis={"url": "sentinel://h1;redis://h2", "sentinel_master": "m"})


def test_cluster_and_sentinel_are_refused_together() -> None:
    problems = _problems(
        redis={"url": THREE, "sentinel_master": "m", "cluster": True}, broker={"url": "redis://b"}
    )
    assert "exclude each other" in problems


def test_a_sentinel_broker_url_needs_sentinel_master() -> None:
    assert "sentinel_master" in _problems(redis={"url": "redis://h:6379/0"}, broker={"url": THREE})


def test_the_settings_give_clients_the_sentinels_and_their_auth() -> None:
    settings = Settings(
        redis={"url": THREE, "sentinel_master": "m", "sentinel_password": "pw", "sentinel_tls": True}
    )
    access = settings.redis.sentinel_access()
    assert access is not None
    assert (access.master, access.sentinel_password, access.tls) == ("m", "pw", True)
    assert access.url.nodes[0] == ("h1", 26379)
    assert Settings(redis={"url": "redis://h:6379/0"}).redis.sentinel_access() is None


def test_celery_is_told_the_master_name_for_broker_and_result_backend() -> None:
    settings = Settings(redis={"url": THREE, "sentinel_master": "m", "sentinel_password": "pw"})
    config = celery_config(settings)
    assert config["broker_url"] == THREE
    assert config["broker_transport_options"]["master_name"] == "m"
    assert config["broker_transport_options"]["sentinel_kwargs"]["password"] == "pw"
    # one attempt per Sentinel: redis-py asks the next itself (its default retry backs off 3 s)
    assert config["broker_transport_options"]["sentinel_kwargs"]["retry"] is None
    assert config["broker_transport_options"]["visibility_timeout"] >= 3600  # kept beside it
    assert config["result_backend_transport_options"]["master_name"] == "m"
    assert "broker_use_ssl" not in config


def test_a_plain_redis_url_gets_no_sentinel_options() -> None:
    config = celery_config(Settings(redis={"url": "redis://h:6379/0"}))
    assert "master_name" not in config["broker_transport_options"]


def test_a_store_client_on_a_sentinel_url_without_the_master_is_refused() -> None:
    with pytest.raises(StoreError, match="sentinel_master"):
        connect(THREE, socket_timeout_s=1, socket_connect_timeout_s=1)
