"""The invoke task's message as a Redis broker holds it, built without Celery's publish path.

``app.send_task`` goes through the producer pool, routing, declarations and signals for every
call (its cost: docs/performance.md) and blocks, so an asyncio caller would have to hop to a
thread for it. Here the message is built by Celery's own ``amqp.as_task_v2`` (the protocol 2 headers,
properties and body a worker reads), then wrapped the way kombu's Redis transport wraps it
(the base64 body and the ``delivery_info`` envelope of ``Channel.basic_publish``), ready for
one ``LPUSH`` onto the queue's list (done by the register script, see
:class:`workers.gateway.dispatching.Dispatcher`): what ``send_task`` with the same options puts there, up
to the per-message ``delivery_tag`` (a fresh uuid either way) and ``reply_to`` (which no
invoke task reads: results live in the ledger). tests/integration/test_task_messages.py compares the
two.

Only for a plain Redis broker without message signing (:func:`fast_publish_possible`):
with signing the body must go through Celery's ``auth`` serializer, and another broker
needs kombu; there the gateway keeps ``send_task`` on a thread.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery import Celery
from kombu.serialization import dumps
from kombu.utils.json import dumps as json_dumps

from workers.settings import Settings

__all__ = ["QueuedMessage", "TaskMessages", "fast_publish_possible"]

_PERSISTENT = 2  # kombu's delivery_mode for a durable message (Celery's default)


def fast_publish_possible(settings: Settings) -> bool:
    """Whether messages may be pushed straight onto the broker's Redis list.

    The broker must be the ledger's own Redis (one asyncio client for both), a single node
    (or the primary of one Sentinel list), and messages unsigned.
    """
    url = settings.broker_url
    # A sentinel:// list is one primary too: the asyncio client follows it as kombu does.
    same_redis = url == settings.redis.url and url.startswith(("redis://", "rediss://", "sentinel://"))
    return same_redis and not settings.redis.cluster and not settings.broker.signing.enabled


@dataclass(frozen=True)
class QueuedMessage:
    """One message as the Redis transport stores it (its ``task-sent`` goes through the Dispatcher)."""

    queue: str
    payload: str


class TaskMessages:
    """Builds invoke messages for one queue exactly as ``send_task`` would (see the module doc)."""

    def __init__(self, app: Celery, queue: str) -> None:
        self._app = app
        self._amqp = app.amqp
        self._queue = queue

    def build(
        self,
        name: str,
        *,
        task_id: str,
        kwargs: dict[str, Any],
        soft_s: float,
        hard_s: float,
        expires: datetime,
        shadow: str,
        now: datetime,
        headers: Mapping[str, str] | None = None,
    ) -> QueuedMessage:
        """The message of ``name(**kwargs)``, its time limits, expiry and Flower label.

        ``headers`` are added to the message's own (as ``send_task(headers=...)`` adds them).
        """
        message = self._amqp.as_task_v2(
            task_id,
            name,
            args=(),
            kwargs=kwargs,
            expires=expires,
            time_limit=hard_s,  # type: ignore[arg-type]  # floats work (as in send_task); stubs say int
            soft_time_limit=soft_s,  # type: ignore[arg-type]
            shadow=shadow,
            ignore_result=True,
            create_sent_event=False,  # the gateway batches task-sent itself (Dispatcher._announce_sent)
            reply_to=self._app.thread_oid,
            now=now,
        )
        message_headers, properties, body, _ = message
        if headers:
            message_headers = {**message_headers, **headers}
        content_type, content_encoding, data = dumps(body, serializer="json")
        properties = {
            **properties,
            "delivery_mode": _PERSISTENT,
            # As send_task: the seconds left until ``expires`` (never negative), in ms.
            "expiration": str(int(max(0.0, (expires - now).total_seconds()) * 1000)),
            "delivery_info": {"exchange": "", "routing_key": self._queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        }
        envelope = {
            "body": base64.b64encode(data.encode() if isinstance(data, str) else data).decode(),
            "content-encoding": content_encoding,
            "content-type": content_type,
            "headers": message_headers,
            "properties": properties,
        }
        return QueuedMessage(self._queue, json_dumps(envelope))
