"""The circuit breaker's decisions, one table of cases (pure: snapshot, policy, now in; decision out)."""

from __future__ import annotations

import pytest

from workers.core.breaker import (
    Admission,
    BreakerPolicy,
    BreakerSnapshot,
    BreakerState,
    Transition,
    admit,
    after_outcome,
    counts_as_failure,
)
from workers.core.models import SyntheticReason, ToolCall
from workers.core.results import fallback_result, success_result, synthetic_result, tool_error_result

POLICY = BreakerPolicy(failures=3, window_s=60, cooldown_s=10, half_open_probes=2)
CLOSED, OPEN, HALF = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


@pytest.mark.parametrize(
    ("snapshot", "now_ms", "expected"),
    [
        # closed: everything runs, nothing is written
        (BreakerSnapshot(), 5_000, Admission(allowed=True)),
        # open within the cooldown: refused, with the time left
        (BreakerSnapshot(OPEN, 1_000, 0, 4), 5_000, Admission(False, retry_after_ms=6_000)),
        (BreakerSnapshot(OPEN, 1_000, 0, 4), 10_999, Admission(False, retry_after_ms=1)),
        # open, cooldown over: the first caller becomes a probe and the breaker half-opens
        (
            BreakerSnapshot(OPEN, 1_000, 0, 4),
            11_000,
            Admission(True, probe=True, transition=Transition(HALF, 11_000, probes=1)),
        ),
        # half-open with a free probe slot: one more probe
        (
            BreakerSnapshot(HALF, 11_000, 1, 5),
            12_000,
            Admission(True, probe=True, transition=Transition(HALF, 11_000, probes=2)),
        ),
        # half-open, slots taken: refused until the period ends
        (BreakerSnapshot(HALF, 11_000, 2, 6), 12_000, Admission(False, retry_after_ms=9_000)),
        # half-open for a whole cooldown (probes never reported): a new period, a new probe
        (
            BreakerSnapshot(HALF, 11_000, 2, 6),
            21_000,
            Admission(True, probe=True, transition=Transition(HALF, 21_000, probes=1)),
        ),
    ],
)
def test_admission(snapshot: BreakerSnapshot, now_ms: int, expected: Admission) -> None:
    assert admit(snapshot, POLICY, now_ms) == expected


@pytest.mark.parametrize(
    ("snapshot", "failed", "probe", "recent", "expected"),
    [
        (BreakerSnapshot(), True, False, 2, None),  # below the threshold
        (BreakerSnapshot(CLOSED, 0, 0, 3), True, False, 3, Transition(OPEN, 50_000)),  # threshold reached
        (BreakerSnapshot(), False, False, 0, None),  # a success while closed changes nothing
        (
            BreakerSnapshot(HALF, 40_000, 1, 7),
            False,
            True,
            0,
            Transition(CLOSED, 50_000, clear_failures=True),
        ),
        (BreakerSnapshot(HALF, 40_000, 1, 7), True, True, 5, Transition(OPEN, 50_000)),
        # a call admitted before the circuit opened and answered after: counted, no transition
        (BreakerSnapshot(OPEN, 40_000, 0, 7), True, False, 9, None),
        (BreakerSnapshot(HALF, 40_000, 1, 7), True, False, 9, None),
        (BreakerSnapshot(HALF, 40_000, 1, 7), False, False, 0, None),
    ],
)
def test_outcomes(
    snapshot: BreakerSnapshot, failed: bool, probe: bool, recent: int, expected: Transition | None
) -> None:
    change = after_outcome(
        snapshot, POLICY, failed=failed, probe=probe, recent_failures=recent, now_ms=50_000
    )
    assert change == expected


CALL = ToolCall(id="c1", name="flaky")


@pytest.mark.parametrize(
    ("result", "failure"),
    [
        (success_result(CALL, "ok", elapsed_ms=1, attempt=1), False),
        (tool_error_result(CALL, "ValueError", "boom", elapsed_ms=1, attempt=1), True),
        (synthetic_result(CALL, SyntheticReason.TIMEOUT_SOFT, elapsed_ms=1, attempt=1), True),
        (synthetic_result(CALL, SyntheticReason.DEADLINE_EXCEEDED, elapsed_ms=1, attempt=1), True),
        (fallback_result(CALL, "cached", SyntheticReason.TOOL_ERROR, elapsed_ms=1, attempt=1), True),
        # refusals say nothing about the tool's health
        (synthetic_result(CALL, SyntheticReason.CIRCUIT_OPEN, elapsed_ms=0, attempt=0), False),
        (synthetic_result(CALL, SyntheticReason.CANCELLED, elapsed_ms=0, attempt=0), False),
        (synthetic_result(CALL, SyntheticReason.INVALID_ARGUMENTS, elapsed_ms=0, attempt=0), False),
        (synthetic_result(CALL, SyntheticReason.LOOP_BLOCKED, elapsed_ms=0, attempt=0), False),
    ],
)
def test_what_counts_as_a_failure(result: object, failure: bool) -> None:
    assert counts_as_failure(result) is failure  # type: ignore[arg-type]


def test_a_policy_refuses_unknown_keys_and_non_positive_numbers() -> None:
    with pytest.raises(ValueError, match="failures"):
        BreakerPolicy(failures=0)
    with pytest.raises(ValueError, match="cooldown"):
        BreakerPolicy.model_validate({"cooldown": 5})
