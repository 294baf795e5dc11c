"""The gateway's side of a cancel: mark the calls, answer at once those no worker holds.

A running call is answered ``cancelled`` once (first writer wins): by its worker, with the
tool's partial output (a cooperative tool sees ``ctx.cancelled``; ``exec`` sends SIGTERM to
its process group, then SIGKILL after ``limits.cancel_grace_s``), or, once that grace is
over, by the worker's main process, which also SIGKILLs the tool's process groups
(:mod:`workers.worker.cancel`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from workers import tracing
from workers.answering.service import Answers
from workers.core.models import CallState
from workers.core.reaping import OpenCall
from workers.errors import StoreError
from workers.store.cancel import CancelMarks
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger

__all__ = ["Canceller"]

T = TypeVar("T")

log = logging.getLogger(__name__)

_LATE_REGISTRATION_S = 10.0  # how long a cancelled acall_tools keeps cancelling calls registered late
_LATE_POLL_S = 0.05

_NOT_STARTED = " before it started (cancel requested)"


class Canceller:
    """Requests cancels for one gateway; every method raises ``StoreError`` when Redis fails."""

    def __init__(self, ledger: Ledger, *, answers: Answers, now_ms: Callable[[], int]) -> None:
        self._ledger = ledger
        self._answers = answers  # a default (tools.fallbacks) may answer a cancelled call
        self._marks = CancelMarks(ledger)
        self._now_ms = now_ms

    def cancel(self, keys: RunKeys, call_ids: Sequence[str] | None = None) -> int:
        """Cancel ``call_ids`` of a run (every call when None); returns how many were unanswered."""
        ids = list(call_ids) if call_ids is not None else self._ledger.run_call_ids(keys)
        now = self._now_ms()
        requests = self._marks.request(keys, ids, now_ms=now)
        idle = [r.call_id for r in requests if r.state is not CallState.RUNNING]

        def answering(call: OpenCall) -> None:
            tracing.answering_here(keys.session_key, keys.run_id, call.call_id)

        self._answers.cancel(keys, idle, now_ms=now, detail=_NOT_STARTED, on_answering=answering).on(
            self._ledger
        )
        return len(requests)

    async def cancel_if_cancelled(self, awaitable: Awaitable[T], keys: RunKeys, call_ids: Sequence[str]) -> T:
        """Await ``awaitable``; when the awaiting task is cancelled, cancel ``call_ids`` first."""
        try:
            return await awaitable
        except asyncio.CancelledError:
            # Synchronous on purpose: the cancel is recorded before the CancelledError goes on.
            # Registration is read BEFORE the marks: a call registered between a mark and a
            # later check would be counted as registered without ever having been marked.
            registered = self._all_registered(keys, call_ids)
            self.cancel(keys, call_ids)
            if not registered:
                # The worker thread had not registered every call yet: cancel them as they come.
                threading.Thread(target=self._cancel_late, args=(keys, call_ids), daemon=True).start()
            raise

    def _all_registered(self, keys: RunKeys, call_ids: Sequence[str]) -> bool:
        answered = self._ledger.results(keys, call_ids)
        return len(answered) + len(self._ledger.open_calls(keys, call_ids)) == len(set(call_ids))

    def _cancel_late(self, keys: RunKeys, call_ids: Sequence[str]) -> None:
        end = time.monotonic() + _LATE_REGISTRATION_S
        try:
            while time.monotonic() < end:
                time.sleep(_LATE_POLL_S)  # waiting for another thread's registration: nothing to block on
                registered = self._all_registered(keys, call_ids)  # before the marks, as above
                self.cancel(keys, call_ids)
                if registered:
                    return
        except StoreError as exc:
            log.warning("late cancel of %s/%s failed: %s", keys.session_key, keys.run_id, exc)
