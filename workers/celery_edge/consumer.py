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
"""

from __future__ import annotations

import functools
import logging
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
    """Counts the messages the consumer refuses, and refuses those its handler cannot read."""

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
