"""When a global index key's TTL needs refreshing: at most once per interval per process.

Every call writes its bucket's ``due`` and ``leases`` indexes, and an ``EXPIRE`` after each
write was three of a call's Redis commands. The index only has to outlive the members written
into it, so a process refreshes a key's TTL at most once per :data:`REFRESH_INTERVAL_S`, and
sets it :data:`REFRESH_INTERVAL_S` longer than ``ttl_s``: a member written up to one interval
after the last refresh still has its ``ttl_s`` ahead of it, as when every write refreshed.

Races between threads only cost an extra ``EXPIRE``; a forked child inherits the parent's
memory of refreshes, which still holds (the TTL is on the server).
"""

from __future__ import annotations

import time

__all__ = ["REFRESH_INTERVAL_S", "IndexTtl"]

#: How often one process refreshes one index key's TTL (and by how much it over-extends it).
REFRESH_INTERVAL_S = 60


class IndexTtl:
    """Remembers when this process last refreshed each index key's TTL."""

    def __init__(self, ttl_s: int) -> None:
        self.expire_s = ttl_s + REFRESH_INTERVAL_S
        self._next_refresh: dict[str, float] = {}

    def due(self, key: str) -> bool:
        """True when ``key``'s TTL should be refreshed now (then counted as refreshed)."""
        now = time.monotonic()
        if self._next_refresh.get(key, 0.0) > now:
            return False
        self._next_refresh[key] = now + REFRESH_INTERVAL_S
        return True

    def forget(self) -> None:
        """Refresh every key on its next write: a round trip that may have lost an EXPIRE failed."""
        self._next_refresh.clear()
