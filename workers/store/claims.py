"""A worker's claim of a call, as ``ledger_claim.lua`` answers it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workers.core.models import ClaimStatus
from workers.store.records import reply_member

__all__ = ["Claim", "claim_of"]


@dataclass(frozen=True)
class Claim:
    """Outcome of a worker's claim: ``claimed`` (run it), or why not (see :class:`ClaimStatus`).

    ``previous_worker`` and ``previous_started_ms`` name the attempt before this one when the
    call is claimed again (``attempt`` > 1): a second execution of the call.
    """

    status: ClaimStatus
    attempt: int
    registered_tool: str = ""  # the tool the call was registered with ('' when unregistered)
    previous_worker: str = ""
    previous_started_ms: int = 0

    @property
    def executes_again(self) -> bool:
        """Whether this claim runs a call an earlier claim already started."""
        return self.status is ClaimStatus.CLAIMED and self.attempt > 1


def claim_of(reply: Sequence[Any]) -> Claim:
    """The :class:`Claim` of one ``ledger_claim.lua`` reply."""
    status = reply_member(ClaimStatus, reply[0], where="ledger_claim.lua")
    previous_worker = str(reply[3]) if len(reply) > 3 else ""
    previous_started_ms = int(reply[4]) if len(reply) > 4 else 0
    return Claim(status, int(reply[1]), str(reply[2]), previous_worker, previous_started_ms)
