"""What a running tool can see and do: its identity, its deadline, heartbeats, and cancellation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workers.core.idempotency import idempotency_key

__all__ = ["ToolContext"]


def _never_cancelled() -> bool:
    return False


@dataclass
class ToolContext:
    """Handed to a tool that declares a ``ctx`` parameter.

    ``heartbeat`` is throttled to one store write per ``min_interval_s``; the latest
    details are always the ones written. ``cancelled`` is likewise read from the store at
    most once per ``min_interval_s``, and stays True once seen.
    """

    session_key: str
    run_id: str
    call_id: str
    attempt: int
    deadline_ms: int
    clock: Callable[[], float]
    on_heartbeat: Callable[[Any], None] = field(repr=False)
    on_process_group: Callable[[int], None] = field(repr=False)
    on_cancel_check: Callable[[], bool] = field(default=_never_cancelled, repr=False)
    cancel_grace_s: float = 5.0
    min_interval_s: float = 0.25
    _last_beat: float = field(default=float("-inf"), repr=False)
    _last_cancel_check: float = field(default=float("-inf"), repr=False)
    cancel_seen: bool = field(default=False, repr=False)
    process_groups: list[int] = field(default_factory=list, repr=False)

    @property
    def idempotency_key(self) -> str:
        """The same for every execution of this call (``attempt`` differs): hand it to side effects.

        Execution is at least once: a call may run again after its worker was lost, or after
        a Redis failover discarded its claim. A payment API's ``Idempotency-Key`` header or a
        unique column keyed by it makes the second execution a no-op there.
        """
        return idempotency_key(self.session_key, self.run_id, self.call_id)

    @property
    def cancelled(self) -> bool:
        """Whether a cancel of this call was requested: stop soon, returning what you have.

        After ``cancel_grace_s`` the worker answers ``cancelled`` itself and interrupts the
        tool; what a tool returns after seeing this becomes the ``partial`` of that answer.
        """
        if not self.cancel_seen:
            now = self.clock()
            if now - self._last_cancel_check >= self.min_interval_s:
                self._last_cancel_check = now
                self.cancel_seen = self.on_cancel_check()
        return self.cancel_seen

    def cancel_settled(self) -> bool:
        """Whether the call was cancelled, asking the store now if the tool started process groups.

        The worker's main process sends SIGTERM to those groups when it sees a cancel, so a
        tool may return (its command killed) before its own throttled check saw the mark.
        """
        if not self.cancel_seen and self.process_groups:
            self.cancel_seen = self.on_cancel_check()
        return self.cancel_seen

    #: Set once the call's fail-branch started: a branch is tried once, whatever fails next.
    fail_branch_tried: bool = field(default=False, repr=False)

    def heartbeat(self, details: Any = None) -> None:
        """Report progress; a tool with ``heartbeat_timeout_s`` must call this often enough."""
        now = self.clock()
        if now - self._last_beat < self.min_interval_s:
            return
        self._last_beat = now
        self.on_heartbeat(details)

    def register_process_group(self, pgid: int) -> None:
        """Record a process group the tool started, so it is killed when the call ends hard."""
        self.process_groups.append(pgid)
        self.on_process_group(pgid)
