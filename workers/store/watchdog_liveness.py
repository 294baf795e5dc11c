"""The watchdog's own liveness record: when its last sweep completed, and the gaps between sweeps.

Written once per completed sweep (one script), read by the metrics exporter, ``unstuck
session`` and the chaos soak, so a watchdog that stopped sweeping is visible from anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.store.connection import store_errors
from workers.store.keys import watchdog_key
from workers.store.ledger import Ledger
from workers.store.lua import load_script
from workers.store.records import WATCHDOG, Row, WatchdogField

__all__ = ["SweepRecord", "WatchdogLiveness"]

RECORD_TTL_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True)
class SweepRecord:
    """The last completed sweep: when, the gap before it, the worst gap seen, how many sweeps."""

    last_sweep_ms: int
    last_gap_ms: int
    max_gap_ms: int
    sweeps: int

    def lag_ms(self, now_ms: int) -> int:
        """Time since the last completed sweep."""
        return max(0, now_ms - self.last_sweep_ms)


class WatchdogLiveness:
    """Reads and writes ``P:{runs}:watchdog``."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._key = watchdog_key(ledger.prefix)
        self._done = load_script(ledger.client, "watchdog_sweep_done.lua")

    def sweep_completed(self, now_ms: int) -> int | None:
        """Record a completed sweep; returns the gap since the previous one (None for the first)."""
        with store_errors():
            gap = int(self._done(keys=[self._key], args=[now_ms, RECORD_TTL_MS]))
        return None if gap < 0 else gap

    def last(self) -> SweepRecord | None:
        """The record, or None when no sweep completed within its TTL."""
        with store_errors():
            row = Row(WATCHDOG, self.ledger.client.hgetall(self._key), where=self._key)
        last = row.maybe_integer(WatchdogField.LAST_SWEEP_MS)
        if last is None:  # the record exists once a sweep completed
            return None
        return SweepRecord(
            last_sweep_ms=last,
            last_gap_ms=row.integer(WatchdogField.LAST_GAP_MS),
            max_gap_ms=row.integer(WatchdogField.MAX_GAP_MS),
            sweeps=row.integer(WatchdogField.SWEEPS),
        )
