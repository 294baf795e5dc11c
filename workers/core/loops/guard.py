"""The post-compaction guard: abort a run whose loop survived context compaction.

A compaction arms the guard for ``window_size`` outcomes. If all of them are the same
``(tool, args hash, result hash)`` triple, compaction did not break the loop and the run is
aborted with ``compaction_loop_persisted``. The guard disarms after ``window_size``
observations whatever the verdict. It is on unless ``enabled`` is explicitly false.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "COMPACTION_DETECTOR",
    "GuardState",
    "GuardTriple",
    "arm_guard",
    "guard_abort_count",
    "guard_message",
    "observe_guard",
]

COMPACTION_DETECTOR = "compaction_loop_persisted"

GuardTriple = tuple[str, str, str]


@dataclass(frozen=True)
class GuardState:
    """How many outcomes the armed guard still watches, and the triples seen since arming."""

    remaining: int
    window: tuple[GuardTriple, ...] = ()


def arm_guard(window_size: int) -> GuardState:
    """A freshly (re-)armed guard: calls observed before arming never count."""
    return GuardState(remaining=window_size)


def observe_guard(
    state: GuardState, triple: GuardTriple
) -> tuple[GuardState, tuple[GuardTriple, ...] | None]:
    """Feed one outcome; returns the new state and the window, or None when the guard is dormant."""
    if state.remaining <= 0:
        return state, None
    window = (*state.window, triple)
    return GuardState(state.remaining - 1, window), window


def guard_abort_count(window: Sequence[GuardTriple], triple: GuardTriple, window_size: int) -> int | None:
    """The repeat count when the window proves the loop persisted (abort), else None."""
    count = sum(1 for seen in window if seen == triple)
    return count if count >= window_size else None


def guard_message(tool: str, count: int, window_size: int) -> str:
    """The abort message for a loop that persisted after compaction."""
    return (
        f"CRITICAL: {tool} repeated {count} times with identical arguments and results within "
        f"{window_size} attempts after auto-compaction; compaction did not break the loop, "
        "so the run is aborted."
    )
