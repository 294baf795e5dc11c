"""What a running tool can see and do: its identity, its deadline, and heartbeats."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ToolContext"]


@dataclass
class ToolContext:
    """Handed to a tool that declares a ``ctx`` parameter.

    ``heartbeat`` is throttled to one store write per ``min_interval_s``; the latest
    details are always the ones written.
    """

    session_key: str
    run_id: str
    call_id: str
    attempt: int
    deadline_ms: int
    clock: Callable[[], float]
    on_heartbeat: Callable[[Any], None] = field(repr=False)
    on_process_group: Callable[[int], None] = field(repr=False)
    min_interval_s: float = 0.25
    _last_beat: float = field(default=float("-inf"), repr=False)

    def heartbeat(self, details: Any = None) -> None:
        """Report progress; a tool with ``heartbeat_timeout_s`` must call this often enough."""
        now = self.clock()
        if now - self._last_beat < self.min_interval_s:
            return
        self._last_beat = now
        self.on_heartbeat(details)

    def register_process_group(self, pgid: int) -> None:
        """Record a process group the tool started, so it is killed when the call ends hard."""
        self.on_process_group(pgid)
