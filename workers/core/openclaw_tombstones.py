"""Sessions OpenClaw's restart recovery gave up on (tombstoned), as its gateway reports them.

After a gateway restart OpenClaw resumes each interrupted main-session turn by itself, with a
durable budget of three charged dispatch attempts; once they are spent (or when a
message-tool-only turn lacks its channel authority) the session is tombstoned: it refuses new
work until someone runs ``/new`` or ``/reset``. Its ``sessions.list`` row then carries
``restartRecoveryStatus: "tombstoned"``. Nothing else tells anyone, so unstuck alerts each
tombstone once.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

__all__ = ["Tombstone", "complete", "tombstone_changes", "tombstone_note", "tombstones"]

#: The value OpenClaw 2026.9.6's session rows carry for a tombstoned session.
TOMBSTONED = "tombstoned"


@dataclass(frozen=True, order=True)
class Tombstone:
    """One tombstoned session: its key and the transcript generation (a reset starts a new one)."""

    session_key: str
    session_id: str


def complete(answer: Mapping[str, Any]) -> bool:
    """Whether a ``sessions.list`` answer holds every session (no further page)."""
    return answer.get("hasMore") is not True


def tombstones(answer: Mapping[str, Any]) -> set[Tombstone]:
    """The tombstoned sessions a ``sessions.list`` answer reports (rows it cannot read are skipped)."""
    rows = answer.get("sessions")
    found = set()
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, Mapping) or row.get("restartRecoveryStatus") != TOMBSTONED:
            continue
        key = row.get("key")
        if isinstance(key, str) and key:
            found.add(Tombstone(key, str(row.get("sessionId") or "")))
    return found


def tombstone_changes(
    current: Set[Tombstone], known: Set[Tombstone], *, complete: bool
) -> tuple[set[Tombstone], set[Tombstone]]:
    """(new tombstones to alert, known ones to forget: no longer reported, so replaced or reset).

    A ``complete`` answer listed every session; from a partial one (``hasMore``) nothing is
    forgotten, or a tombstone past its last row would be alerted again when it shows up.
    """
    return set(current - known), set(known - current) if complete else set()


def tombstone_note(tombstone: Tombstone) -> str:
    """What the alert says: what happened, and what a person has to do."""
    return (
        f"[unstuck] OpenClaw session {tombstone.session_key} was tombstoned by its restart recovery: "
        "its automatic retries ran out and it refuses new work. Inspect it, then start a "
        "replacement with /new or /reset."
    )
