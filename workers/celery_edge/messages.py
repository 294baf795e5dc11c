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

It carries no Celery ``expires``: a Redis broker ignores a message's TTL, and the expiry check
Celery makes of every message it takes (parsing the time, converting its zone) cost the
worker's main process about 40 µs of a guarded call's CPU under load (docs/performance.md).
The claim refuses a registered call past the deadline its message carries
(``ledger_claim.lua``: ``expired``), which covers this message and any other.

The ``kwargsrepr`` header (what Flower shows as the task's arguments) is written here as Celery's
``saferepr`` writes it (:func:`kwargs_repr`): ``saferepr``'s token stream cost a gateway about
110 µs of CPU per call, a tenth of its share of a call (docs/performance.md); a job it cannot
copy exactly (another type, or too long, so cut) still goes through ``saferepr``.

Only for a plain Redis broker without message signing (:func:`fast_publish_possible`):
with signing the body must go through Celery's ``auth`` serializer, and another broker
needs kombu; there the gateway keeps ``send_task`` on a thread.
"""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery import Celery
from celery.utils.nodenames import anon_nodename
from kombu.serialization import dumps
from kombu.utils.json import dumps as json_dumps

from workers.settings import Settings

__all__ = ["QueuedMessage", "Shown", "TaskMessages", "fast_publish_possible", "kwargs_repr", "shown"]

_PERSISTENT = 2  # kombu's delivery_mode for a durable message (Celery's default)


def kwargs_repr(kwargs: Mapping[str, Any], maxlen: int, maxlevels: int) -> str | None:
    """``celery.utils.saferepr.saferepr(kwargs, maxlen, maxlevels)`` for JSON-like values, or None.

    The same text, built in one pass: strings quoted as ``saferepr`` quotes them (only ``'``
    escaped), numbers, booleans and None as ``str``, containers past ``maxlevels`` as ``{...}``
    or ``[...]``. None when a value of another type appears or the text reaches ``maxlen``
    (``saferepr`` would cut it): the caller then leaves it to ``saferepr``.
    tests/unit/test_task_messages_repr.py holds the two equal.
    """
    parts: list[str] = []
    if not _flat_repr(kwargs, 0, maxlevels, parts):
        return None
    text = "".join(parts)
    return text if len(text) < maxlen else None


class Shown:
    """A task's return value that Celery's ``saferepr`` shows as ``text``, and encodes as ``value``.

    Celery renders a task's return value with ``saferepr`` for its success log line and the
    ``task-succeeded`` event Flower reads; its token stream cost a pool child about 16 µs of CPU
    a call (35 under load) for the invoke task's four-field summary. An object of another type
    than the containers it walks is shown by its ``repr``, built here in one pass. Where the
    value is stored (a message that did not ask to ignore its result), kombu's JSON encoder
    takes ``__json__`` and pickle ``__reduce__``: both give the plain ``value``.
    """

    __slots__ = ("text", "value")

    def __init__(self, text: str, value: dict[str, Any]) -> None:
        self.text = text
        self.value = value

    def __repr__(self) -> str:
        return self.text

    def __json__(self) -> dict[str, Any]:
        return self.value

    def __reduce__(self) -> tuple[type[dict[str, Any]], tuple[dict[str, Any]]]:
        return dict, (self.value,)


def shown(value: dict[str, Any], maxlen: int, maxlevels: int) -> Shown | dict[str, Any]:
    """``value``, to be shown by Celery as ``saferepr(value, maxlen, maxlevels)`` shows it, at less cost.

    ``value`` itself where :func:`kwargs_repr` cannot copy that text exactly.
    """
    text = kwargs_repr(value, maxlen, maxlevels)
    return value if text is None else Shown(text, value)


def _flat_repr(value: Any, level: int, maxlevels: int, out: list[str]) -> bool:
    kind = type(value)
    if kind is str:
        out.append("'" + value.replace("'", "\\'") + "'")
    elif kind is bool or kind is int or kind is float:
        out.append(str(value))
    elif value is None:
        out.append("None")
    elif kind is dict or kind is list:
        opening, closing = ("{", "}") if kind is dict else ("[", "]")
        if maxlevels and level >= maxlevels:
            out.append(opening + "..." + closing)
            return True
        out.append(opening)
        items = value.items() if kind is dict else enumerate(value)
        for n, (key, item) in enumerate(items):
            if n:
                out.append(", ")
            if kind is dict:
                if type(key) is not str:
                    return False
                out.append("'" + key.replace("'", "\\'") + "': ")
            if not _flat_repr(item, level + 1, maxlevels, out):
                return False
        out.append(closing)
    else:
        return False
    return True


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
        self._origin = (0, "")  # (pid, Celery's name for this process): it changes with a fork

    def _origin_of_this_process(self) -> str:
        # The origin header as send_task writes it, without a gethostname per call.
        pid, origin = self._origin
        if pid != os.getpid():
            self._origin = pid, origin = os.getpid(), anon_nodename()
        return origin

    def build(
        self,
        name: str,
        *,
        task_id: str,
        kwargs: dict[str, Any],
        soft_s: float,
        hard_s: float,
        shadow: str,
        now: datetime,
        headers: Mapping[str, str] | None = None,
        queue: str | None = None,
    ) -> QueuedMessage:
        """The message of ``name(**kwargs)``, its time limits and Flower label.

        ``headers`` are added to the message's own (as ``send_task(headers=...)`` adds them);
        ``queue`` replaces this builder's (a stateful MCP upstream's calls have their own).
        """
        queue = queue or self._queue
        amqp = self._amqp
        message = amqp.as_task_v2(
            task_id,
            name,
            args=(),
            kwargs=kwargs,
            argsrepr="()",  # saferepr(()), which Celery would work out for every call
            kwargsrepr=kwargs_repr(kwargs, amqp.kwargsrepr_maxsize, self._app.conf.task_repr_maxlevels),
            time_limit=hard_s,  # type: ignore[arg-type]  # floats work (as in send_task); stubs say int
            soft_time_limit=soft_s,  # type: ignore[arg-type]
            shadow=shadow,
            ignore_result=True,
            create_sent_event=False,  # the gateway batches task-sent itself (Dispatcher._announce_sent)
            reply_to=self._app.thread_oid,
            now=now,
            origin=self._origin_of_this_process(),
        )
        message_headers, properties, body, _ = message
        if headers:
            message_headers = {**message_headers, **headers}
        content_type, content_encoding, data = dumps(body, serializer="json")
        properties = {
            **properties,
            "delivery_mode": _PERSISTENT,
            "delivery_info": {"exchange": "", "routing_key": queue},
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
        return QueuedMessage(queue, json_dumps(envelope))
