"""Which running calls have a stale heartbeat."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["stale_heartbeats"]


def stale_heartbeats(beats: Mapping[str, tuple[int, float]], *, now_ms: int) -> set[str]:
    """Ids whose last beat (ms) is older than their heartbeat timeout (s)."""
    return {key for key, (last_ms, timeout_s) in beats.items() if now_ms - last_ms > timeout_s * 1000}
