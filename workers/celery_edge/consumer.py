"""The consumer of both consuming roles (tool worker, watchdog): no message body can stop it.

Celery's consumer drops a message it cannot decode (a bad or unknown signature, garbage) or
whose content type it does not accept (an unsigned message when signing is on), before any
task code runs; this subclass counts those refusals with the worker's own
(``unstuck_refused_messages_total``). It also survives a body Celery's own handler trips
over: on an empty signed body the stock handler raises ``TypeError`` out of the event loop,
which would stop the worker, and the unacknowledged message would stop the next one the same
way, so such a message is dropped as undecodable.

It reconnects to a lost broker within a second: Celery's consumer waits kombu's default
2, 4, 6, ... s between attempts (2 s apart at first, 30 s at most), so a worker that lost its
broker to a Redis failover (the replica promoted 2-3 s after the primary died) came back
6 or 12 s after the fault though the new primary took connections long before.

And it publishes its task events in batches: Celery buffers the ``task`` group's events
(received, started, succeeded, failed, ...) and flushes them at the next event-loop tick, so
sequential calls would publish two or three messages each, all on the worker's main process
(the measured cost: docs/architecture.md). This consumer flushes ``broker.task_events_flush_ms``
after the first buffered event instead (Flower sees a call's events that much later, in the
same order), and whenever it stops, shuts down or loses its connection, so no event is left
behind; the dispatcher itself still flushes a full buffer at once.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from celery.worker.consumer import Consumer
from kombu.exceptions import ContentDisallowed

from workers.core.refusal import RefusalReason
from workers.runtime import runtime
from workers.worker.refusal import record_refusal

__all__ = ["RefusingConsumer"]

log = logging.getLogger(__name__)

#: The pauses between attempts to reconnect to the broker: 0.5 s, then every second.
_RECONNECT_START_S = 0.5
_RECONNECT_STEP_S = 0.5
_RECONNECT_MAX_S = 1.0


def _task_id(message: Any) -> str:
    headers = getattr(message, "headers", None)
    return str(headers.get("id", "?")) if isinstance(headers, dict) else "?"


def _count(reason: RefusalReason, message: Any, exc: BaseException) -> None:
    detail = f"{type(exc).__name__}: {exc}"[:300]
    try:
        ledger = runtime().ledger
    except Exception as error:  # noqa: BLE001 - counting must never stop the consumer
        log.warning("refused message %s (%s) not counted: %s", _task_id(message), reason.value, error)
        return
    record_refusal(ledger, _task_id(message), reason, detail, kind="task")


class RefusingConsumer(Consumer):
    """Counts the messages the consumer refuses, and refuses those its handler cannot read.

    It also reconnects within a second and batches its task events (the module's docstring).
    """

    _events_due_at = 0.0  # monotonic time of the flush already scheduled (0: none)
    # Set by Celery (absent from the stubs): the event loop (None without one) and the
    # dispatcher the Events step makes at each start (None before it and after its shutdown).
    hub: Any
    event_dispatcher: Any

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        """Celery's handler, guarded: a body it raises on is dropped as undecodable."""
        handle = super().create_task_handler(*args, **kwargs)
        # Set by Celery from the broker transport (absent from the stubs).
        connection_errors = (*getattr(self, "connection_errors", ()), *getattr(self, "channel_errors", ()))

        def on_task_received(message: Any) -> Any:
            try:
                return handle(message)
            except connection_errors:
                raise  # the broker's own failures: Celery reconnects
            except Exception as exc:  # noqa: BLE001 - any hostile body is refused, the worker goes on
                self.on_decode_error(message, exc)
                return None

        return on_task_received

    def ensure_connected(self, conn: Any) -> Any:
        """Celery's (re)connection to the broker, its attempts a second apart at most."""
        conn.ensure_connection = functools.partial(
            conn.ensure_connection,
            interval_start=_RECONNECT_START_S,
            interval_step=_RECONNECT_STEP_S,
            interval_max=_RECONNECT_MAX_S,
        )
        return super().ensure_connected(conn)

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        """Count, then Celery's handling: log it and acknowledge it (never redelivered)."""
        _count(RefusalReason.UNDECODABLE, message, exc)
        super().on_decode_error(message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        """Count, then Celery's handling: log it and reject it."""
        reason = (
            RefusalReason.UNTRUSTED_CONTENT
            if isinstance(exc, ContentDisallowed)
            else RefusalReason.UNREADABLE
        )
        _count(reason, message, exc)
        super().on_invalid_task(body, message, exc)

    def on_send_event_buffered(self) -> Any:  # the stubs say a callable; Celery returns None
        """A task event was buffered: publish the buffer at the interval's end (Celery: next tick)."""
        interval_s = runtime().settings.broker.task_events_flush_ms / 1000
        if self.hub is None or interval_s <= 0:
            super().on_send_event_buffered()
            return
        now = time.monotonic()
        if now < self._events_due_at:
            return  # this interval's flush is already set
        self._events_due_at = now + interval_s
        self.hub.call_later(interval_s, self._flush_buffered_events)

    def _flush_buffered_events(self) -> None:
        self._events_due_at = 0.0
        dispatcher = self.event_dispatcher
        if dispatcher is None:
            return
        try:
            dispatcher.flush()  # buffered again if the broker is down
        except Exception as exc:  # noqa: BLE001 - Flower's view is best effort, never a failure path
            log.warning("could not flush task events: %s", exc)

    def on_close(self) -> None:
        """The connection is lost: hand the buffered events on, then restart (no timer of ours left).

        The restarted ``Events`` step carries over only what its old dispatcher failed to
        publish, not what it held for a flush: flushing now moves the held events there (the
        broker is likely down) or publishes them.
        """
        self._flush_buffered_events()
        super().on_close()

    def stop(self) -> None:
        """Publish the buffered task events while the dispatcher is still open, then stop."""
        self._flush_buffered_events()
        super().stop()

    def shutdown(self) -> None:
        """Publish the events of the tasks that finished during the warm shutdown, then shut down."""
        self._flush_buffered_events()
        super().shutdown()
