"""The shared circuit breaker of a tool: closed, open, half-open, decided from a snapshot and ``now``.

The store keeps the counts (recent failures, probes in flight) and applies a transition only
if the breaker has not changed since it was read (``generation``); every decision is made
here, so the rules are one table of cases (``tests/unit/test_breakers.py``).

- closed: calls run; ``failures`` failures of the tool within ``window_s`` (across every
  session) open it.
- open: calls are answered ``circuit_open`` at once until ``cooldown_s`` has passed.
- half-open: up to ``half_open_probes`` calls run as probes; a probe that succeeds closes
  the breaker (failures forgotten), one that fails opens it again. Probes that never report
  (their gateway died) free their slots after another ``cooldown_s``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

from workers.core.models import SyntheticReason, ToolResult

__all__ = [
    "Admission",
    "BreakerPolicy",
    "BreakerSnapshot",
    "BreakerState",
    "Transition",
    "admit",
    "after_outcome",
    "counts_as_failure",
    "describe",
]


class BreakerPolicy(BaseModel):
    """``tools.breakers.<tool>``: when the tool's circuit opens and how it recovers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    failures: PositiveInt = Field(5, description="failures within window_s that open the circuit")
    window_s: PositiveFloat = Field(60.0, description="how far back failures count, seconds")
    cooldown_s: PositiveFloat = Field(
        30.0, description="seconds an open circuit answers at once, before probes"
    )
    half_open_probes: PositiveInt = Field(1, description="calls let through at once to probe the tool")


class BreakerState(enum.StrEnum):
    """Where a tool's breaker stands."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerSnapshot:
    """A breaker as read from the store (a breaker never written reads as closed, generation 0)."""

    state: BreakerState = BreakerState.CLOSED
    since_ms: int = 0  # when it entered ``state``
    probes: int = 0  # probes let through in the current half-open period
    generation: int = 0  # bumped by every transition: the store's compare-and-set token


@dataclass(frozen=True)
class Transition:
    """A change to apply if the breaker still is ``snapshot`` (compare-and-set on its generation)."""

    state: BreakerState
    since_ms: int
    probes: int = 0
    clear_failures: bool = False


@dataclass(frozen=True)
class Admission:
    """Whether a call may run now; ``probe`` calls report back, ``retry_after_ms`` when refused."""

    allowed: bool
    probe: bool = False
    retry_after_ms: int = 0
    transition: Transition | None = None


# Reasons that say the tool itself was reached and failed; refusals before it ran
# (invalid arguments, a loop block, an open circuit, a cancel) say nothing about its health.
_FAILURE_REASONS = frozenset(
    {
        SyntheticReason.TOOL_ERROR,
        SyntheticReason.TIMEOUT_SOFT,
        SyntheticReason.TIMEOUT_HARD,
        SyntheticReason.HEARTBEAT_TIMEOUT,
        SyntheticReason.WORKER_LOST,
        SyntheticReason.CRASHED,
        SyntheticReason.OUT_OF_MEMORY,
        SyntheticReason.DEADLINE_EXCEEDED,
    }
)


def counts_as_failure(result: ToolResult) -> bool:
    """Whether ``result`` (a fallback included: it stands in for a failure) is a failure of the tool."""
    return result.reason in _FAILURE_REASONS


def admit(snapshot: BreakerSnapshot, policy: BreakerPolicy, now_ms: int) -> Admission:
    """May a call of the tool run at ``now_ms``?"""
    cooldown_ms = int(policy.cooldown_s * 1000)
    cooled = now_ms >= snapshot.since_ms + cooldown_ms
    if snapshot.state is BreakerState.CLOSED:
        return Admission(allowed=True)
    if snapshot.state is BreakerState.OPEN:
        if not cooled:
            return Admission(allowed=False, retry_after_ms=snapshot.since_ms + cooldown_ms - now_ms)
        return Admission(True, probe=True, transition=Transition(BreakerState.HALF_OPEN, now_ms, probes=1))
    if cooled:  # half-open for a whole cooldown: its probes never reported, start a new period
        return Admission(True, probe=True, transition=Transition(BreakerState.HALF_OPEN, now_ms, probes=1))
    if snapshot.probes < policy.half_open_probes:
        probes = snapshot.probes + 1
        return Admission(True, probe=True, transition=Transition(snapshot.state, snapshot.since_ms, probes))
    return Admission(allowed=False, retry_after_ms=snapshot.since_ms + cooldown_ms - now_ms)


def after_outcome(
    snapshot: BreakerSnapshot,
    policy: BreakerPolicy,
    *,
    failed: bool,
    probe: bool,
    recent_failures: int,
    now_ms: int,
) -> Transition | None:
    """The transition an answered call causes, if any.

    ``recent_failures`` counts the tool's failures within the window, this one included.
    """
    if snapshot.state is BreakerState.HALF_OPEN and probe:
        if failed:
            return Transition(BreakerState.OPEN, now_ms)
        return Transition(BreakerState.CLOSED, now_ms, clear_failures=True)
    if snapshot.state is BreakerState.CLOSED and failed and recent_failures >= policy.failures:
        return Transition(BreakerState.OPEN, now_ms)
    return None


def describe(
    tool: str, snapshot: BreakerSnapshot, policy: BreakerPolicy, recent_failures: int, now_ms: int
) -> dict[str, object]:
    """One breaker as ``unstuck breakers`` and the metrics show it."""
    cooldown_ms = int(policy.cooldown_s * 1000)
    waiting = snapshot.state is not BreakerState.CLOSED
    return {
        "tool": tool,
        "state": snapshot.state.value,
        "since_ms": snapshot.since_ms,
        "recent_failures": recent_failures,
        "failures_to_open": policy.failures,
        "window_s": policy.window_s,
        "probes": snapshot.probes,
        "retry_after_s": max(0, snapshot.since_ms + cooldown_ms - now_ms) / 1000 if waiting else 0.0,
    }
