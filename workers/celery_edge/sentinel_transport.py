"""kombu's Sentinel transport, kept on the primary the Sentinels name now.

kombu asks the Sentinels where the primary is only when a connection opens, and a worker keeps
its BRPOP and pub/sub connections open for as long as they work. A primary stopped long enough
for its replica to be promoted works again when it resumes, and answers every BRPOP with an
empty queue (the calls go to the new primary) until the Sentinels demote it 8-10 s later.
This transport registers every connection pool kombu opens with the process's primary watch
(:mod:`workers.store.primary_watch`), and a consumer closes its own connections to a node that
is no longer the primary at the next tick of its event loop; kombu opens them again through
the Sentinels, on the new primary.

It serves the ``sentinel://`` scheme itself (:func:`serve_sentinel_urls`, called when the
Celery app is configured on such a ``broker.url``), rather than being named by Celery's
``broker_transport``: kombu fails over between the URLs of a ``;`` list by parsing the next
one, which set the transport back to kombu's own from its scheme, and the publishers that
reconnected that way stayed on a resumed old primary. The interval comes from the transport
option ``primary_check_interval_s`` (``redis.primary_check_interval_ms``).
"""

from __future__ import annotations

import logging
from typing import Any

import kombu.transport as kombu_transport
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis

from workers.store.primary_watch import follow_primary, primary_moved

__all__ = ["PRIMARY_CHECK_OPTION", "Channel", "Transport", "serve_sentinel_urls"]

log = logging.getLogger(__name__)

#: The transport option that carries redis.primary_check_interval_ms, in seconds.
PRIMARY_CHECK_OPTION = "primary_check_interval_s"
_DEFAULT_CHECK_S = 0.5


class Channel(kombu_redis.SentinelChannel):
    """A Sentinel channel whose pools follow the primary the Sentinels name."""

    from_transport_options = (*kombu_redis.SentinelChannel.from_transport_options, PRIMARY_CHECK_OPTION)
    primary_check_interval_s = _DEFAULT_CHECK_S

    def _sentinel_managed_pool(self, asynchronous: bool = False) -> Any:
        pool = super()._sentinel_managed_pool(asynchronous)  # type: ignore[misc]  # untyped in kombu
        follow_primary(pool, self.primary_check_interval_s)
        return pool

    def leave_moved_primary(self) -> None:
        """Close the consumer's own connections (BRPOP, pub/sub) to a node that is no longer primary."""
        for name in ("client", "subclient"):
            client: Any = self.__dict__.get(name)  # only what the channel has opened
            connection = getattr(client, "connection", None)
            if connection is None or getattr(connection, "_sock", None) is None:
                continue
            if primary_moved(client.connection_pool, connection.host, connection.port):
                log.warning(
                    "broker %s connection to %s:%s left: the Sentinels name another primary",
                    "BRPOP" if name == "client" else "pub/sub",
                    connection.host,
                    connection.port,
                )
                connection.disconnect()


class Transport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport with :class:`Channel`."""

    Channel = Channel

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        """Kombu's registration, plus a check that the consumer's connections are on the primary."""
        super().register_with_event_loop(connection, loop)
        interval_s = float(connection.client.transport_options.get(PRIMARY_CHECK_OPTION, _DEFAULT_CHECK_S))
        cycle: Any = self.cycle

        def leave_moved_primary() -> None:
            for channel in list(cycle._channels):
                channel.leave_moved_primary()

        # kombu cancels its own timers on a reconnect; this one is replaced the same way.
        old = getattr(cycle, "_unstuck_primary_tref", None)
        if old is not None:
            old.cancel()
        cycle._unstuck_primary_tref = loop.call_repeatedly(interval_s, leave_moved_primary)


def serve_sentinel_urls() -> None:
    """Make :class:`Transport` the one kombu picks for every ``sentinel://`` URL in this process."""
    TRANSPORT_ALIASES["sentinel"] = f"{__name__}:Transport"
    # kombu keeps each name it resolved (kombu.transport._transport_cache, private: no public
    # way to forget one): a process that resolved sentinel:// before this call would go on with
    # kombu's own transport, which never leaves a resumed old primary. tests/unit/
    # test_primary_watch.py fails when kombu renames or drops the cache.
    kombu_transport.__dict__["_transport_cache"].pop("sentinel", None)
