"""A worker's claim of a call, as ``ledger_claim.lua`` answers it, and its count in the run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from workers.core.models import ClaimStatus
from workers.store.connection import store_errors
from workers.store.keys import RunKeys
from workers.store.lua import load_script, run_script
from workers.store.records import reply_member

__all__ = ["Claim", "ClaimCounter", "claim_of"]


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


class ClaimCounter:
    """Counts running calls' claims in their runs' summaries (``claimed_n``), off the claim's path.

    A claim does not count itself: most calls are answered within milliseconds, and counting
    them would cost two writes of the run record per call, undone by the finish at once. The
    worker's lease keeper counts each call still running at its next tick
    (``ledger_count_claim.lua``), once per claim (the call's ``counted`` flag).
    """

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._script = load_script(client, "ledger_count_claim.lua", with_summary=True)

    def count(self, keys: RunKeys, call_id: str, *, now_ms: int) -> bool:
        """Count the claim of ``call_id`` if it is running and not counted yet; True when this counted it.

        Raises:
            StoreError: Redis failed.
        """
        with store_errors():
            return bool(run_script(self._client, self._script, [keys.call(call_id), keys.run], [now_ms]))
