"""The worker main process's side of a cancel: SIGTERM the tool's groups, then SIGKILL and answer.

Run from the lease keeper's tick (it already lists the calls this worker runs). For each
call with a cancel mark: at first sight its recorded process groups get SIGTERM (a
cooperative tool also sees ``ctx.cancelled`` and returns what it has); once
``limits.cancel_grace_s`` plus one tick has passed without the call being answered, the
main process answers ``cancelled`` (first writer wins), SIGKILLs the groups and interrupts
the pool child the way the soft limit does. Decisions: :func:`workers.core.cancel.cancel_step`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workers.core.cancel import CancelStep, cancel_step
from workers.errors import StoreError
from workers.store.cancel import CancelMarks
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger

__all__ = ["CancelEnforcer", "RunningJob", "cancel_check"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunningJob:
    """A call this worker runs: the task's kwargs, its run, its id, and its pool child (``host:pid``)."""

    kwargs: Any
    keys: RunKeys
    call_id: str
    worker: str


def cancel_check(ledger: Ledger, keys: RunKeys, call_id: str) -> Callable[[], bool]:
    """What ``ctx.cancelled`` asks in the pool child: is there a cancel mark on this call?"""
    marks: list[CancelMarks] = []  # made at the first check: most tools never ask

    def check() -> bool:
        try:
            if not marks:
                marks.append(CancelMarks(ledger))
            return marks[0].requested([(keys, call_id)])[0] > 0
        except StoreError as exc:
            log.warning("could not read the cancel mark of %s: %s", call_id, exc)
            return False

    return check


class CancelEnforcer:
    """Escalates cancels of the calls running on this worker (main process, one thread)."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        grace_s: float,
        slack_s: float,
        answer: Callable[[RunningJob], None],
        interrupt: Callable[[RunningJob], None],
    ) -> None:
        self._ledger = ledger
        self._marks = CancelMarks(ledger)
        self._grace_ms = int(grace_s * 1000)
        self._slack_ms = int(slack_s * 1000)
        self._answer = answer
        self._interrupt = interrupt
        self._terminated: set[tuple[str, str]] = set()
        self._killed: set[tuple[str, str]] = set()

    def tick(self, jobs: Sequence[RunningJob], *, now_ms: int) -> None:
        """Look at every running call once; raises ``StoreError`` when Redis fails."""
        requested = self._marks.requested([(job.keys, job.call_id) for job in jobs])
        live: set[tuple[str, str]] = set()
        for job, requested_ms in zip(jobs, requested, strict=True):
            if not requested_ms:
                continue
            key = (job.keys.tag, job.call_id)
            live.add(key)
            step = cancel_step(
                requested_ms=requested_ms,
                now_ms=now_ms,
                grace_ms=self._grace_ms,
                slack_ms=self._slack_ms,
                terminated=key in self._terminated,
            )
            if step is CancelStep.TERMINATE:
                self._terminated.add(key)
                self._signal_groups(job, signal.SIGTERM)
            elif step is CancelStep.KILL and key not in self._killed:
                self._killed.add(key)
                self._answer(job)  # answers `cancelled` if nobody did, and SIGKILLs the groups
                self._signal_groups(job, signal.SIGKILL)
                self._interrupt(job)
        self._terminated &= live
        self._killed &= live

    def _signal_groups(self, job: RunningJob, sig: signal.Signals) -> None:
        for pgid in self._ledger.process_groups(job.keys, job.call_id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
