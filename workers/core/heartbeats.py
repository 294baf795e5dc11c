"""Decisions the worker's main process makes about calls running in its pool children."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["ChildVerdict", "RunningCall", "judge_running_call"]


class ChildVerdict(enum.Enum):
    """What to do with one call a pool child is running."""

    IGNORE = "ignore"  # not running here (pending, finished, or another host's)
    RENEW = "renew"  # alive: extend the lease
    CHILD_DIED = "child_died"  # its pool child is gone: answer `crashed`
    HEARTBEAT_STALE = "heartbeat_stale"  # alive but silent too long: answer and interrupt


@dataclass(frozen=True)
class RunningCall:
    """What the ledger and the process table say about one call."""

    state: str
    worker: str
    last_beat_ms: int
    heartbeat_timeout_s: float | None


def judge_running_call(call: RunningCall, *, host: str, child_alive: bool, now_ms: int) -> ChildVerdict:
    """Classify a call claimed by a child of this host (``worker`` is ``host:pid``)."""
    if call.state != "running" or call.worker.rsplit(":", 1)[0] != host:
        return ChildVerdict.IGNORE
    if not child_alive:
        return ChildVerdict.CHILD_DIED
    if call.heartbeat_timeout_s is not None and now_ms - call.last_beat_ms > call.heartbeat_timeout_s * 1000:
        return ChildVerdict.HEARTBEAT_STALE
    return ChildVerdict.RENEW
