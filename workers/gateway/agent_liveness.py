"""The agent's own liveness: heartbeats while its model thinks or streams, and streams gone idle.

The watchdog classifies runs from their activity. Tool activity alone would call a run whose
model streams for minutes without a tool call ``stalled`` or ``stuck``; these heartbeats keep
it ``active``. A run that stops beating and calling tools becomes ``stuck`` after
``watchdog.stalled_after_s``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from workers.errors import StoreError
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger
from workers.store.sessions import AgentBeats

__all__ = ["MIN_BEAT_INTERVAL_MS", "AgentLiveness"]

log = logging.getLogger(__name__)

MIN_BEAT_INTERVAL_MS = 1000
"""At most one store write per run per second, however fast the chunks arrive."""

_CACHE_SIZE = 4096


class AgentLiveness:
    """Throttled heartbeats and idle-stream records of the runs of one gateway."""

    def __init__(
        self,
        beats: AgentBeats,
        ledger: Ledger,
        *,
        now_ms: Callable[[], int],
        ensure_run: Callable[[RunKeys, str], None],
    ) -> None:
        self._beats = beats
        self._ledger = ledger
        self._now_ms = now_ms
        self._ensure_run = ensure_run
        self._last_beat_ms: dict[tuple[str, str], int] = {}

    def heartbeat(self, keys: RunKeys, *, agent_id: str, what: str) -> bool:
        """Record that the agent works on its run; False once the run ended or was superseded.

        Never raises for a store failure (logged; the answer is then True: unknown).
        """
        run = (keys.session_key, keys.run_id)
        now = self._now_ms()
        last = self._last_beat_ms.get(run)
        if last is not None and now - last < MIN_BEAT_INTERVAL_MS:
            return True
        try:
            if last is None:
                self._ensure_run(keys, agent_id)  # a run may start with a model turn
            running = self._beats.heartbeat(keys, now_ms=now, what=what)
        except StoreError as exc:
            log.warning("heartbeat of %s/%s not recorded: %s", *run, exc)
            return True
        self._remember(run, now)
        return running

    def forget(self, keys: RunKeys) -> None:
        """Drop the throttle of a run that ended, so its next heartbeat asks the store."""
        self._last_beat_ms.pop((keys.session_key, keys.run_id), None)

    def stream_idle(self, keys: RunKeys, *, idle_timeout_s: float) -> None:
        """Record that a model stream of the run went idle past ``idle_timeout_s`` (event + field)."""
        try:
            self._beats.stream_idle(keys, now_ms=self._now_ms())
            self._ledger.publish_event(
                "stream_idle", session_key=keys.session_key, run_id=keys.run_id, idle_timeout_s=idle_timeout_s
            )
        except StoreError as exc:
            log.warning("idle stream of %s/%s not recorded: %s", keys.session_key, keys.run_id, exc)

    def _remember(self, run: tuple[str, str], now: int) -> None:
        if run not in self._last_beat_ms and len(self._last_beat_ms) >= _CACHE_SIZE:
            self._last_beat_ms.pop(next(iter(self._last_beat_ms)))
        self._last_beat_ms[run] = now
