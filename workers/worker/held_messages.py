"""Messages a worker took ahead of a free pool process, given back when they wait too long.

A worker takes its next messages before a pool process frees (prefetch), so a child's next call
is in hand the moment it finishes one. A message taken while every child runs a long call
would wait for one of them, however long, while other workers sit idle. So the worker's main
process notes each invoke message it takes (Celery's ``task_received``) and forgets it when a
child starts it; one still waiting ``worker.give_back_after_ms`` later is published again, as
it was received, for any worker to take.

Both copies may then reach a pool child. Whichever claims the call first runs it; the other
finds it running or answered and runs nothing (``ledger_claim.lua``), as with any republished
message. The ledger counts the republish (``ledger_republish.lua``), which succeeds only while
the call is pending and unleased: a call claimed, answered or past its deadline meanwhile is
not published again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workers.core.reaping import ActionKind, Reap
from workers.errors import StoreError
from workers.runtime import now_ms, runtime, worker_id
from workers.worker.lost_calls import job_of, worker_answers

__all__ = ["Held", "HeldMessages", "give_back", "held_messages", "install_held_messages"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Held:
    """One message taken and not started: its Celery request and when it was taken."""

    request: Any  # Celery's request: its kwargs hold the job, its message what to publish again
    taken_ms: int


class HeldMessages:
    """The invoke messages this worker took and no pool child started yet (thread-safe).

    Keyed by the request object, not its task id: a message given back may come back to the
    same worker while its first copy is still held, under the same task id.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, Held] = {}

    def taken(self, request: Any, now_ms: int) -> None:
        """The worker took ``request``'s message at ``now_ms``."""
        with self._lock:
            self._held[id(request)] = Held(request, now_ms)

    def started(self, request: Any) -> None:
        """``request`` left the worker's hands: a child started it, or it ended unstarted."""
        with self._lock:
            self._held.pop(id(request), None)

    def due(self, now_ms: int, after_ms: int) -> list[Held]:
        """Take out the messages held ``after_ms`` or longer (each is given back once)."""
        with self._lock:
            due = [held for held in self._held.values() if now_ms - held.taken_ms >= after_ms]
            for held in due:
                del self._held[id(held.request)]
        return due

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)


_installed: HeldMessages | None = None


def install_held_messages() -> HeldMessages:
    """The worker main process's record of held messages (one per process)."""
    global _installed
    _installed = HeldMessages()
    return _installed


def held_messages() -> HeldMessages | None:
    """The record installed in this process: a worker's main process's, or None.

    A pool child inherits an unused copy; a gateway has none.
    """
    return _installed


def give_back(held: list[Held], publish: Callable[[Any], None]) -> int:
    """Publish again each held message whose call still waits unclaimed; how many were.

    ``publish`` sends a request's message again, as received. The ledger takes the republish
    first, so two copies are never counted as one, and a call that was claimed or answered
    meanwhile is left alone.
    """
    given = 0
    for entry in held:
        try:
            given += _give_back_one(entry, publish)
        except StoreError as exc:
            log.warning("held message of task %s not given back: %s", entry.request.id, exc)
    return given


def _give_back_one(entry: Held, publish: Callable[[Any], None]) -> int:
    job = job_of(entry.request.kwargs)
    if job is None:
        return 0  # not a call: nothing in the ledger says whether it still waits
    rt = runtime()
    keys = rt.ledger.keys(job.session_key, job.run_id)
    now = now_ms()
    calls = rt.ledger.open_calls(keys, [job.call.id])
    waiting = [call for call in calls if call.waiting_in_queue and call.deadline_ms > now]
    if not waiting:
        return 0
    reap = Reap(waiting[0], ActionKind.REPUBLISH)
    _, resend = worker_answers(rt, worker_id()).reap(keys, [reap], now_ms=now).on(rt.ledger)
    if not resend:
        return 0  # another gateway or worker published it again first
    publish(entry.request)
    log.info("gave back task %s (call %s): no pool process started it", entry.request.id, job.call.id)
    return 1
