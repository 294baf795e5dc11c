"""Celery's AMQP helpers with a task consumer that takes Redis messages without acknowledging them.

See :class:`LedgerAckedAMQP` for why, and tests/integration/test_broker_acks.py for what pins it.
"""

from __future__ import annotations

from typing import Any

from celery.app.amqp import AMQP
from kombu import Consumer

__all__ = ["LedgerAckedAMQP"]


# The consumer tag every message of an unacknowledging consumer is stamped with (below).
_UNACKED_TAG = "unstuck-unacked"


class _UnackedConsumer(Consumer):
    """A kombu consumer that takes messages without acknowledging them, on Redis.

    kombu skips ``ack()`` for a no-ack consumer's message only when the message names that
    consumer's tag in its delivery info, which kombu's Redis transport never fills in: left
    alone, Celery's ack would still cost a MULTI round trip removing a tag never stored. Each
    message is stamped with one tag that the channel lists as not acknowledging.
    """

    def revive(self, channel: Any) -> None:
        """Kombu's revive, then the channel learns that this consumer's messages take no ack."""
        super().revive(channel)
        self.channel.no_ack_consumers = {_UNACKED_TAG}  # type: ignore[union-attr]  # a channel now

    def _receive_callback(self, message: Any) -> Any:
        if isinstance(getattr(message, "delivery_info", None), dict):
            message.delivery_info["consumer_tag"] = _UNACKED_TAG
        return super()._receive_callback(message)


class LedgerAckedAMQP(AMQP):
    """Celery's AMQP helpers, but tool messages from a Redis broker are taken without acks.

    On Redis, kombu tracks every unacknowledged message in two keys (``unacked``,
    ``unacked_index``): two MULTI round trips and eight commands per call in the worker's main
    process (its cost: docs/performance.md). What that buys is a
    redelivery after the visibility timeout (>= 1 h), later than any call's deadline, and the
    ledger already answers every registered call by its deadline whatever became of its message.
    With ``worker_disable_prefetch`` a worker takes a message only for a free pool slot, so
    there is no buffer of taken-but-unstarted messages to lose either. RabbitMQ keeps its acks:
    it ignores prefetch limits for consumers that do not acknowledge.
    """

    def TaskConsumer(self, channel: Any, queues: Any = None, accept: Any = None, **kw: Any) -> Any:
        """Celery's task consumer; on Redis with prefetch disabled, one that never acknowledges."""
        if not (self.app.conf.worker_disable_prefetch and channel.transport.driver_type == "redis"):
            return super().TaskConsumer(channel, queues, accept, **kw)
        return _UnackedConsumer(
            channel,
            accept=self.app.conf.accept_content if accept is None else accept,
            queues=queues or list(self.queues.consume_from.values()),
            no_ack=True,
            **kw,
        )
