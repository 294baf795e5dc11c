"""Which connections leave a node the Sentinels no longer name, and which transport serves them."""

from __future__ import annotations

import kombu.transport as kombu_transport
import pytest
from kombu import Connection
from kombu.transport import TRANSPORT_ALIASES, get_transport_cls
from redis.connection import ConnectionPool
from redis.sentinel import Sentinel, SentinelConnectionPool

from workers.celery_edge.sentinel_transport import Transport, serve_sentinel_urls
from workers.store.primary_watch import primary_moved


class _Naming(Sentinel):
    """Sentinels that name ``master`` without being asked over the network."""

    def __init__(self, master: tuple[str, int]) -> None:
        super().__init__([("127.0.0.1", 1)])
        self.master = master

    def discover_master(self, service_name: str) -> tuple[str, int]:
        return self.master


def _pool(master: tuple[str, int] | None) -> SentinelConnectionPool:
    """A pool that has found ``master`` (None: one that has not asked yet)."""
    pool = SentinelConnectionPool("unstuck-primary", _Naming(master or ("127.0.0.1", 1)))  # type: ignore[no-untyped-call]
    if master is not None:
        pool.get_master_address()  # type: ignore[no-untyped-call]
    return pool


@pytest.mark.parametrize(
    ("master", "connected_to", "moved"),
    [
        (("127.0.0.1", 6379), ("127.0.0.1", 6380), True),
        (("127.0.0.1", 6379), ("127.0.0.1", 6379), False),
        (("127.0.0.1", 6379), ("127.0.0.1", "6379"), False),
        (None, ("127.0.0.1", 6380), False),
    ],
)
def test_a_connection_moves_only_when_the_named_primary_is_another_node(
    master: tuple[str, int] | None, connected_to: tuple[str, object], moved: bool
) -> None:
    assert primary_moved(_pool(master), *connected_to) is moved


def test_a_pool_that_follows_no_sentinels_never_moves() -> None:
    assert primary_moved(ConnectionPool(host="127.0.0.1", port=6379), "127.0.0.1", 6380) is False


def test_every_sentinel_url_is_served_by_the_following_transport_even_after_kombu_fails_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a process that resolved sentinel:// to kombu's own transport first (kombu caches it),
    # then registered the following transport (as configuring the Celery app does)
    monkeypatch.setitem(TRANSPORT_ALIASES, "sentinel", "kombu.transport.redis:SentinelTransport")
    monkeypatch.setattr(kombu_transport, "_transport_cache", {})
    resolved_first: object = get_transport_cls("sentinel")
    assert resolved_first is not Transport
    serve_sentinel_urls()
    connection = Connection(
        "sentinel://127.0.0.1:1;sentinel://127.0.0.1:2", transport_options={"master_name": "m"}
    )
    try:
        # When kombu fails over to the next URL of the list (it parses that URL's scheme again)
        first = connection.transport_cls
        connection.switch("sentinel://127.0.0.1:2")
        # Then both are the following transport, not kombu's own
        assert Connection(transport=first).transport.__class__ is Transport
        assert type(connection.transport) is Transport
    finally:
        connection.release()
