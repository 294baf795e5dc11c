"""Close a call's Celery task in Flower when its answer was written outside the task.

The gateway and the watchdog answer calls that no task could answer (``worker_lost``,
``deadline_exceeded``, ``heartbeat_timeout``, ``cancelled``, ``dispatch_failed``, and every
call refused at submission). Each such answer is stored through their ledger, whose
``on_answered`` listener queues it here; a background thread then sends the Celery task
events that end the call's task in the state its result deserves (``task-failed`` or
``task-revoked``, see :mod:`workers.core.outcome`), preceded by ``task-received`` for a call
no worker ever received, so Flower lists every call the agent made, with its reason.

The gateway also sends each dispatched call's ``task-sent`` here (Celery's own would cost a
publish per call). Events are batched: the sender waits up to ``flush_ms`` after the first
one, then publishes the whole batch as one ``task.multi`` message; :meth:`TaskEvents.flush`
and :meth:`TaskEvents.close` send at once.

Sending never delays an answer: the queue is bounded and a broker that is down only costs
events (logged). The events come from ``unstuck-<role>@<host>``, which Flower shows as the
task's worker: who answered.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import threading
from collections.abc import Callable
from typing import Any

from celery import Celery

from workers.celery_edge.names import INVOKE_TASK_ID, INVOKE_TASK_LABEL
from workers.core.models import SyntheticReason, ToolResult
from workers.core.outcome import closing_event, outcome_of
from workers.errors import StoreError
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger
from workers.store.records import CallField

__all__ = ["TaskEvents"]

log = logging.getLogger(__name__)

_BATCH = 200
Event = tuple[str, dict[str, Any]]
Pending = Callable[[], list[Event]]
"""A queued item: builds its events in the sender thread (an answer's read its record first)."""


def _send_now() -> list[Event]:
    return []  # queued by flush(): ends the wait for more events


class TaskEvents:
    """Sends the task events of answers stored through ``ledger`` (attach with :meth:`attach`)."""

    def __init__(
        self, app: Celery, ledger: Ledger, *, role: str, flush_ms: int = 0, capacity: int = 10_000
    ) -> None:
        self.hostname = f"unstuck-{role}@{socket.gethostname()}"
        self._app = app
        self._ledger = ledger
        self._flush_s = flush_ms / 1000
        self._capacity = capacity
        self._lock = threading.Lock()
        self._queue: queue.Queue[Pending | None] = queue.Queue(capacity)
        self._wake = threading.Event()  # ends the sender's wait for more events (flush, close)
        self._pid = 0

    def attach(self) -> TaskEvents:
        """Listen to every answer the ledger stores first; returns self."""
        self._ledger.on_answered.append(self.answered)
        return self

    def answered(self, keys: RunKeys, result: ToolResult) -> None:
        """Queue the events closing the task of ``result``'s call (never blocks)."""
        if not self._put(lambda: self._closing_events(keys, result)):
            log.warning("Flower events queue full; call %s not shown as answered", result.tool_call_id)

    def sent(self, fields: dict[str, Any]) -> None:
        """Queue the ``task-sent`` of a published task (Celery's fields: uuid, name, args, ...)."""
        if not self._put(lambda: [("task-sent", fields)]):
            log.debug("Flower events queue full; task %s not shown as sent", fields.get("uuid"))

    def flush(self, timeout_s: float) -> bool:
        """Send what is queued now; wait up to ``timeout_s`` until it was sent (or failed); True if so."""
        if self._queue.unfinished_tasks:
            self._put(_send_now)
            self._wake.set()
        return self._wait_sent(timeout_s)

    def close(self, timeout_s: float) -> None:
        """Send what is queued (up to ``timeout_s``), then stop the sender thread."""
        if self._pid == os.getpid():
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(None)  # ends the wait for more events, then the thread
            self._wake.set()
            self._pid = 0
        self._wait_sent(timeout_s)

    def _put(self, item: Pending) -> bool:
        self._ensure_sender()
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            return False
        return True

    def _wait_sent(self, timeout_s: float) -> bool:
        with self._queue.all_tasks_done:
            return self._queue.all_tasks_done.wait_for(lambda: not self._queue.unfinished_tasks, timeout_s)

    def _closing_events(self, keys: RunKeys, result: ToolResult) -> list[Event]:
        try:
            return self.events_for(keys, result)
        except StoreError as exc:  # without its task id the call cannot be shown
            log.warning("no Flower event for call %s: %s", result.tool_call_id, exc)
            return []

    def events_for(self, keys: RunKeys, result: ToolResult) -> list[Event]:
        """The events closing the call's task: ``task-received`` first if no worker received it."""
        record = self._ledger.record(keys, result.tool_call_id)
        task_id = record.row.text(CallField.TASK_ID) if record is not None else ""
        label = INVOKE_TASK_LABEL.format(
            tool=result.tool_name, session_key=keys.session_key, run_id=keys.run_id
        )
        events: list[Event] = []
        if not task_id or result.reason == SyntheticReason.DISPATCH_FAILED.value:
            task_id = task_id or INVOKE_TASK_ID.format(
                due_member=keys.due_member(result.tool_call_id), attempt=0
            )
            call = {
                "session_key": keys.session_key,
                "run_id": keys.run_id,
                "call_id": result.tool_call_id,
                "tool": result.tool_name,
            }
            received = {"uuid": task_id, "name": label, "args": "()", "kwargs": repr(call), "retries": 0}
            events.append(("task-received", received))
        event_type, fields = closing_event(outcome_of(result))
        events.append((event_type, {"uuid": task_id, "name": label, **fields}))
        return events

    def _ensure_sender(self) -> None:
        # Started on first use, and again in a forked child (threads do not survive a fork).
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid == os.getpid():
                return
            if self._pid:
                self._queue = queue.Queue(self._capacity)
                self._wake = threading.Event()
            threading.Thread(target=self._run, name="unstuck-task-events", daemon=True).start()
            self._pid = os.getpid()

    def _run(self) -> None:
        pending = self._queue
        while True:
            batch = self._collect(pending)
            items = [item for item in batch if item is not None]
            try:
                events = [event for item in items for event in item()]
                if events:
                    self._send(events)
            except Exception as exc:  # noqa: BLE001 - Flower's view is best effort, never a failure path
                log.warning("could not send task events of %d item(s) for Flower: %s", len(items), exc)
            finally:
                for _ in batch:
                    pending.task_done()
            if batch[-1] is None:
                return

    def _collect(self, pending: queue.Queue[Pending | None]) -> list[Pending | None]:
        """The next batch: what comes within ``flush_ms`` of its first item (or until a flush or close).

        The window is waited out once, then the queue drained: waiting on the queue for each
        item woke this thread once per event, a thread switch per call in a gateway.
        """
        batch = [pending.get()]
        if batch[-1] is None or batch[-1] is _send_now:
            return batch
        if pending.qsize() < _BATCH:
            self._wake.wait(self._flush_s)
        self._wake.clear()  # before the drain: a flush's marker put after it is drained next time
        while len(batch) < _BATCH and batch[-1] is not None and batch[-1] is not _send_now:
            try:
                batch.append(pending.get_nowait())
            except queue.Empty:
                break
        return batch

    def _send(self, events: list[Event]) -> None:
        # What app.events.default_dispatcher does, with the buffer set through the dispatcher's
        # documented arguments: the task group buffered, so the whole batch is one task.multi message.
        with self._app.producer_pool.acquire(block=True) as producer:
            dispatcher = self._app.events.Dispatcher(
                producer.connection,
                hostname=self.hostname,
                channel=producer.channel,
                buffer_while_offline=False,
                buffer_group=frozenset({"task"}),
                buffer_limit=len(events) + 1,
            )
            with dispatcher:
                for event_type, fields in events:
                    dispatcher.send(event_type, **fields)
                dispatcher.flush()
