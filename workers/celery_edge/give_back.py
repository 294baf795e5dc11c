"""Celery's side of giving back held messages (what and why: :mod:`workers.worker.held_messages`).

Public Celery and kombu only: the ``task_received`` signal notes each invoke message the
worker's main process takes, the task's request class forgets it when a pool child accepts it
(``on_accepted``, :mod:`workers.celery_edge.request`), a bootstep's thread gives back what
waited too long, and a kombu producer publishes the received message again: its body (still
signed, if it was), headers and properties, onto the queue it came from.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import Celery, bootsteps, signals

from workers.celery_edge.names import INVOKE_TASK
from workers.runtime import runtime
from workers.worker.held_messages import Held, HeldMessages, give_back, install_held_messages

__all__ = ["GiveBack", "publish_again"]

log = logging.getLogger(__name__)

# The message properties a copy keeps (the transport sets its own delivery tag and envelope).
_KEPT_PROPERTIES = ("correlation_id", "reply_to", "delivery_mode", "priority")
_MIN_STEP_S = 0.01  # how often the thread looks at most, whatever give_back_after_ms says


def publish_again(app: Celery, request: Any) -> None:
    """Publish the message of ``request`` again, as this worker received it."""
    message = request.message
    queue = (message.delivery_info or {}).get("routing_key") or app.conf.task_default_queue
    properties = {k: message.properties[k] for k in _KEPT_PROPERTIES if message.properties.get(k) is not None}
    with app.producer_or_acquire() as producer:
        producer.publish(
            message.body,
            exchange="",  # the default exchange: straight onto the queue named by the routing key
            routing_key=queue,
            headers=dict(message.headers),
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            retry=True,
            retry_policy=app.conf.task_publish_retry_policy,
            **properties,
        )


class GiveBack(bootsteps.StartStopStep):
    """Notes the invoke messages the worker takes; gives back those no pool child started in time.

    Off (not included) when ``worker.give_back_after_ms`` is 0: the worker then takes a
    message only for a free pool process (``worker_disable_prefetch``), and holds none.
    """

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self._app: Celery = worker.app
        self._after_ms = runtime().settings.worker.give_back_after_ms
        self._stop = threading.Event()
        self._held: HeldMessages | None = None

    def include_if(self, worker: Any) -> bool:
        """Only with a give-back delay (see the class doc)."""
        return bool(runtime().settings.worker.give_back_after_ms)

    def create(self, worker: Any) -> None:
        """Start noting taken messages (the signal fires in the main process only)."""
        self._held = install_held_messages()
        signals.task_received.connect(self._taken, weak=False)

    def start(self, worker: Any) -> None:
        """Start the thread that gives back what waited too long."""
        threading.Thread(target=self._loop, name="unstuck-give-back", daemon=True).start()

    def stop(self, worker: Any) -> None:
        """Stop giving back: kombu puts what is still held back on its queue as its channel closes."""
        self._stop.set()

    def _taken(self, request: Any = None, **_: Any) -> None:
        # The task's own name: the request's is the Flower label the gateway shadows it with.
        if self._held is not None and getattr(getattr(request, "task", None), "name", None) == INVOKE_TASK:
            self._held.taken(request, _monotonic_ms())

    def _loop(self) -> None:
        step_s = max(self._after_ms / 2000, _MIN_STEP_S)
        while not self._stop.wait(step_s):
            if self._held is not None:
                self._give_back(self._held.due(_monotonic_ms(), self._after_ms))

    def _give_back(self, due: list[Held]) -> None:
        if not due:
            return
        try:
            give_back(due, lambda request: publish_again(self._app, request))
        except Exception:  # the thread must outlive one failed publish: the gateway republishes too
            log.exception("giving back held messages failed")


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000
