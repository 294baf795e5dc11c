"""Results the gateway had to hand over while Redis was unreachable, stored as soon as it is back.

The waiter answers a call locally only when the store cannot be reached by the call's
deadline plus half the grace. What it hands over is what any other writer would store at
that point (the canonical deadline result, or the answer prepared at submission), and this
persister writes it first-writer-wins as soon as Redis answers again, so the ledger ends up
holding what the agent got. If another result won meanwhile (possible only when a result
reached Redis just before it went away), the difference is logged and published as a
``delivered_differs`` event: it is visible, never silent.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from workers.answering.service import Answers
from workers.core.models import ToolResult
from workers.errors import StoreError
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger

__all__ = ["Persister"]

log = logging.getLogger(__name__)

# How long closing waits for a store attempt in flight (it ends within a socket timeout).
_STOP_WAIT_S = 3.0


@dataclass(frozen=True)
class _Pending:
    keys: RunKeys
    result: ToolResult
    give_up_ms: int


class Persister:
    """A daemon thread that retries storing locally delivered results until Redis takes them."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        answers: Answers,
        now_ms: Callable[[], int],
        retry_s: float = 0.25,
        keep_trying_s: float = 600.0,
    ) -> None:
        self._ledger = ledger
        self._answers = answers
        self._now_ms = now_ms
        self._retry_s = retry_s
        self._keep_trying_ms = int(keep_trying_s * 1000)
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._settled = threading.Condition()
        self._unsettled = 0
        self._stopped = False

    def store_later(self, keys: RunKeys, result: ToolResult) -> None:
        """Queue ``result`` (already handed to the agent) for storing; never blocks."""
        with self._lock:
            if self._stopped:
                log.error(
                    "not storing the delivered result of %s: the gateway is closed", result.tool_call_id
                )
                return
            with self._settled:
                self._unsettled += 1
            self._queue.put(_Pending(keys, result, self._now_ms() + self._keep_trying_ms))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="unstuck-persister", daemon=True)
                self._thread.start()

    def drain(self, timeout_s: float) -> bool:
        """Wait until everything queued is stored or given up (tests, shutdown); True when done."""
        self._wake.set()  # retry now rather than after the back-off
        with self._settled:
            return self._settled.wait_for(lambda: self._unsettled == 0, timeout_s)

    def stop(self) -> None:
        """Stop retrying before the ledger's client closes; what is still unstored is logged."""
        with self._lock:
            self._stopped = True
            thread = self._thread
        if self._unsettled:
            log.error("closing with %d delivered result(s) not stored: Redis refused them", self._unsettled)
        self._queue.put(None)  # ends the thread's wait for work
        self._wake.set()
        if thread is not None:
            thread.join(timeout=_STOP_WAIT_S)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._store(item)
            finally:
                with self._settled:
                    self._unsettled -= 1
                    self._settled.notify_all()

    def _store(self, item: _Pending) -> None:
        call_id = item.result.tool_call_id
        while not self._stopped:
            try:
                stored = (
                    self._answers.answer(item.keys, item.result, now_ms=self._now_ms())
                    .on(self._ledger)
                    .result
                )
                break
            except StoreError:
                if self._now_ms() >= item.give_up_ms:
                    log.error("gave up storing the delivered result of %s: Redis unreachable", call_id)
                    return
                self._wake.wait(self._retry_s)
                self._wake.clear()
        else:
            return  # stopped: the client is closing, and a retry on it would fail outside StoreError
        if stored is not None and stored != item.result:
            log.error("the ledger holds another result for %s than the one delivered", call_id)
            self._ledger.publish_event(
                "delivered_differs",
                session_key=item.keys.session_key,
                run_id=item.keys.run_id,
                call_id=call_id,
                delivered_reason=item.result.reason or "",
                stored_reason=stored.reason or "",
            )
