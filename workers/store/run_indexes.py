"""When a run's calls key may expire: an absolute time, so a registration sets its TTL once.

A call record lives ``ledger.ttl_s`` (plus a refresh interval and a second) past its deadline
(``ledger_register.lua``). The run's calls key, the index registration checks a call id
against (``ZADD NX``), must outlive every record it lists, so it expires at the same point
after the latest deadline among its calls, rounded up to a whole refresh interval: calls
registered within one interval share that time, and the register script sets ``PEXPIRE``
only when a call's time is later than the one the run record holds (``keys_until_ms``).
"""

from __future__ import annotations

from workers.store.keys import REFRESH_INTERVAL_S

__all__ = ["RunKeysTtl"]


class RunKeysTtl:
    """The absolute expiry of a run's calls key, from its calls' deadlines."""

    def __init__(self, ttl_s: int) -> None:
        self._step_ms = REFRESH_INTERVAL_S * 1000
        self._after_ms = ttl_s * 1000 + self._step_ms + 1000  # a record's TTL past its deadline

    def until_ms(self, deadline_ms: int) -> int:
        """When the calls key may expire, given a call with this deadline (ms, a step boundary)."""
        earliest = deadline_ms + self._after_ms
        return -(-earliest // self._step_ms) * self._step_ms
