"""Registering a call: the last stage of the call path, written once.

A call that passed the earlier stages (:class:`workers.gateway.call_path.CallPath`) is
planned (its limits, record and message), registered through the ledger, whose register
script pushes its message onto the broker's Redis list in the same step when it can
(:mod:`workers.celery_edge.messages`), and announced. Written once: the asyncio module (an
event loop registers without a thread hop) is the source the sync one is generated from
(``make generate``), so a registration costs the same round trips either way. A call the
store did not take is left to the waiter (answered ``dispatch_failed``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from workers.errors import StoreError
from workers.gateway.batch import Batch, InFlight
from workers.gateway.dispatching import Dispatcher, Submission
from workers.store.ledger import AsyncLedger, Registration

__all__ = ["AsyncRegistering"]


class _Path(Protocol):
    """What registration needs of :class:`workers.gateway.call_path.CallPath` (which holds one)."""

    def plan(self, batch: Batch, in_flight: InFlight) -> Submission: ...

    def registered(self, batch: Batch, submission: Submission, registration: Registration) -> None: ...

    def unregistered(self, batch: Batch, submission: Submission, exc: StoreError) -> None: ...


@dataclass(frozen=True)
class AsyncRegistering:
    """Registers and publishes the calls of a call path's batches on one ledger.

    ``offload`` runs the rare step that reads the store synchronously (a refusal reads the
    run's abort) where it may block: a thread on asyncio, at once on the sync path.
    """

    path: _Path
    dispatcher: Dispatcher
    ledger: AsyncLedger
    offload: Callable[..., Awaitable[Any]]

    async def register(self, batch: Batch, in_flight: InFlight) -> None:
        """Register the call and publish it; the waiter takes it from here.

        The message rides in the register script when the broker is Redis: registered and
        published in one step, or neither. A call so registered and published in the batch's
        last round trip is noted (``batch.registered_last``): the waiter blocks before
        reading it, one read less per call.
        """
        path = self.path
        submission = path.plan(batch, in_flight)
        job = submission.job
        try:
            registration = await self.ledger.register_call(
                submission.keys,
                job.call.id,
                now_ms=job.submitted_ms,
                deadline_ms=job.deadline_ms,
                fields=submission.fields,
                push=submission.push,
            )
            self.dispatcher.sent(submission, registration)
            if registration.refused:
                # The run ended meanwhile: its refusal is read and stored synchronously (rare).
                await self.offload(path.registered, batch, submission, registration)
                return
            path.registered(batch, submission, registration)
        except StoreError as exc:
            path.unregistered(batch, submission, exc)
            return
        if registration.created and submission.push is not None:
            batch.registered_last = in_flight.call.id
