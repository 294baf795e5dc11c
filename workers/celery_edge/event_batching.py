"""Batch the consumer's task events: one ``task.multi`` message per interval, not one per loop tick.

Celery buffers the ``task`` group's events (received, started, succeeded, failed, ...) and
asks the event loop to flush on its next tick, so sequential calls would publish two or three
messages each, all on the worker's main process (its cost: docs/performance.md). This step
flushes ``broker.task_events_flush_ms`` after the first buffered event instead (Flower sees a
call's events that much later, in the same order), or as soon as the buffer holds
:data:`BUFFER_LIMIT` events, and flushes what is buffered whenever the consumer stops,
restarts or shuts down, so no event is left behind.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from celery.worker.consumer.events import Events

from workers.runtime import runtime

__all__ = ["BUFFER_LIMIT", "BatchedTaskEvents"]

log = logging.getLogger(__name__)

BUFFER_LIMIT = 256
"""Events held before a flush whatever the interval (Celery's default is 24): one message."""


class BatchedTaskEvents(bootsteps.StartStopStep):
    """Re-arms the consumer's event dispatcher (made by ``Events`` at each start) to flush on a timer."""

    requires = (Events,)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.interval_s = runtime().settings.broker.task_events_flush_ms / 1000
        self._consumer = c
        self._due = False

    def start(self, c: Any) -> None:
        """Make the new dispatcher wait for the interval (0 or no event loop: Celery's own flush)."""
        self._due = False  # a restart dropped the old loop's timers
        dispatcher = c.event_dispatcher
        if dispatcher is None or c.hub is None or self.interval_s <= 0:
            return
        dispatcher.buffer_limit = BUFFER_LIMIT
        dispatcher.on_send_buffered = self.schedule

    def schedule(self) -> None:
        """An event was buffered: flush at the end of the interval (once per interval)."""
        if self._due:
            return
        self._due = True
        self._consumer.hub.call_later(self.interval_s, self.flush)

    def flush(self) -> None:
        """Publish what is buffered as one message per group (buffered again if the broker is down)."""
        self._due = False
        dispatcher = self._consumer.event_dispatcher
        if dispatcher is None:
            return
        try:
            dispatcher.flush()
        except Exception as exc:  # noqa: BLE001 - Flower's view is best effort, never a failure path
            log.warning("could not flush task events: %s", exc)

    def stop(self, c: Any) -> None:
        """Flush before a restart or stop, while the dispatcher (made by ``Events``) is still open."""
        self.flush()

    def shutdown(self, c: Any) -> None:
        """Flush the events of the tasks that finished during the warm shutdown."""
        self.flush()
