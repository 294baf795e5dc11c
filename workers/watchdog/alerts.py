"""Watchdog alerts: always to the log, optionally as a JSON POST to a webhook.

Posting happens on one background thread fed by a bounded queue, so a slow or dead webhook
never delays a sweep: when the queue is full the alert is logged and dropped. Each POST is
retried with exponential backoff; the thread waits on an event, so ``close`` stops it at once.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

__all__ = ["AlertSink", "post_json"]

log = logging.getLogger(__name__)


def post_json(url: str, payload: dict[str, Any], timeout_s: float) -> None:
    """POST ``payload`` as JSON; raises ``OSError`` (incl. ``URLError``) on failure or a non-2xx reply."""
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        if not 200 <= response.status < 300:
            raise urllib.error.URLError(f"webhook answered HTTP {response.status}")


class AlertSink:
    """Log every alert; deliver it to ``webhook_url`` (if set) in the background, with retries."""

    def __init__(
        self,
        webhook_url: str = "",
        *,
        attempts: int = 5,
        first_backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        timeout_s: float = 5.0,
        capacity: int = 1000,
        post: Callable[[str, dict[str, Any], float], None] = post_json,
        publish: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.webhook_url = webhook_url
        self._publish = publish
        self._attempts = attempts
        self._first_backoff_s = first_backoff_s
        self._max_backoff_s = max_backoff_s
        self._timeout_s = timeout_s
        self._post = post
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=capacity)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def emit(self, event: dict[str, Any]) -> None:
        """Log ``event`` and queue it for the webhook; never blocks."""
        log.warning("watchdog alert: %s", json.dumps(event, sort_keys=True, default=str))
        if self._publish is not None:
            self._publish(event)
        if not self.webhook_url:
            return
        self._ensure_thread()
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            log.error("watchdog alert dropped: webhook queue full (%d)", self._queue.maxsize)

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the delivery thread (alerts still queued are dropped)."""
        self._stop.set()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout_s)

    def _ensure_thread(self) -> None:
        with self._lock:
            # A forked pool child inherits the object but not the thread: start one here.
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="unstuck-alerts", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            event = self._queue.get()
            if event is None:
                return
            self._deliver(event)

    def _deliver(self, event: dict[str, Any]) -> None:
        backoff = self._first_backoff_s
        for attempt in range(1, self._attempts + 1):
            try:
                self._post(self.webhook_url, event, self._timeout_s)
                return
            except OSError as exc:
                log.warning("webhook attempt %d/%d failed: %s", attempt, self._attempts, exc)
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, self._max_backoff_s)
        log.error("watchdog alert not delivered after %d attempts: %s", self._attempts, event.get("kind"))
