"""Limit arithmetic: soft/hard limits, deadlines, and the retry policy's boundaries."""

from __future__ import annotations

import pytest

from workers.core.call_limits import CallLimits, escaped_soft_limit_reason, resolve_limits
from workers.core.models import RetryPolicy, SyntheticReason
from workers.errors import StoreError, ToolExecutionError

NOW_MS = 1_700_000_000_000


def _resolve(**overrides: object) -> CallLimits:
    kwargs: dict[str, object] = {
        "now_ms": NOW_MS,
        "soft_s": 10.0,
        "declared_hard_s": None,
        "heartbeat_s": None,
        "hard_grace_s": 5.0,
        "queue_allowance_s": 5.0,
    }
    kwargs.update(overrides)
    return resolve_limits(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("soft_s", "declared_hard_s", "grace_s", "queue_s", "expected_hard_s", "expected_deadline_ms"),
    [
        (10.0, None, 5.0, 5.0, 15.0, NOW_MS + 20_000),  # hard = soft + grace
        (10.0, 12.0, 5.0, 5.0, 12.0, NOW_MS + 17_000),  # a declared hard limit wins over the grace
        (10.0, 8.0, 5.0, 5.0, 10.0, NOW_MS + 15_000),  # hard is never below soft
        (0.25, None, 0.5, 0.125, 0.75, NOW_MS + 875),  # sub-second limits keep millisecond precision
        (300.0, None, 5.0, 5.0, 305.0, NOW_MS + 310_000),
    ],
)
def test_hard_limit_and_deadline(
    soft_s: float,
    declared_hard_s: float | None,
    grace_s: float,
    queue_s: float,
    expected_hard_s: float,
    expected_deadline_ms: int,
) -> None:
    # When
    limits = _resolve(
        soft_s=soft_s, declared_hard_s=declared_hard_s, hard_grace_s=grace_s, queue_allowance_s=queue_s
    )
    # Then
    assert limits.soft_s == soft_s
    assert limits.hard_s == expected_hard_s
    assert limits.deadline_ms == expected_deadline_ms
    assert limits.submitted_ms == NOW_MS


def test_heartbeat_is_carried_through() -> None:
    assert _resolve(heartbeat_s=3.0).heartbeat_s == 3.0
    assert _resolve().heartbeat_s is None


@pytest.mark.parametrize("run_deadline_ms", [None, NOW_MS + 20_000, NOW_MS + 20_001, NOW_MS + 10**9])
def test_a_later_run_deadline_changes_nothing(run_deadline_ms: int | None) -> None:
    limits = _resolve(run_deadline_ms=run_deadline_ms)
    assert (limits.soft_s, limits.hard_s, limits.deadline_ms) == (10.0, 15.0, NOW_MS + 20_000)


@pytest.mark.parametrize("remaining_ms", [19_999, 10_000, 4_000, 1])
def test_a_sooner_run_deadline_shrinks_the_limits_to_fit(remaining_ms: int) -> None:
    # Given a run that ends before queue allowance + hard limit (20 s) would
    run_deadline_ms = NOW_MS + remaining_ms
    # When
    limits = _resolve(run_deadline_ms=run_deadline_ms)
    # Then the call ends with the run, and its limits scale down proportionally
    assert limits.deadline_ms == run_deadline_ms
    scale = remaining_ms / 20_000
    assert limits.soft_s == pytest.approx(10.0 * scale)
    assert limits.hard_s == pytest.approx(15.0 * scale)
    assert 0 < limits.soft_s < limits.hard_s
    # The worker's hard limit still lands before the deadline.
    assert NOW_MS + (5.0 * scale + limits.hard_s) * 1000 <= run_deadline_ms + 1


@pytest.mark.parametrize("run_deadline_ms", [NOW_MS, NOW_MS - 1, NOW_MS - 60_000])
def test_a_passed_run_deadline_gives_tiny_positive_limits_and_now_as_deadline(run_deadline_ms: int) -> None:
    limits = _resolve(run_deadline_ms=run_deadline_ms)
    assert limits.deadline_ms == NOW_MS
    assert 0 < limits.soft_s < 0.01
    assert 0 < limits.hard_s < 0.01


# --- retry policy ---------------------------------------------------------------------------


class Flaky(Exception):
    pass


@pytest.mark.parametrize(
    ("attempts", "error", "attempt", "expected"),
    [
        (1, Flaky(), 1, False),  # the default policy never retries
        (3, Flaky(), 1, True),  # listed in retry_on
        (3, Flaky(), 2, True),
        (3, Flaky(), 3, False),  # the last attempt is the last
        (3, Flaky(), 4, False),
        (3, ValueError("x"), 1, False),  # neither listed nor retryable
        (3, ToolExecutionError("x", retryable=True), 1, True),  # the typed field decides
        (3, ToolExecutionError("x", retryable=False), 1, False),
        (3, ToolExecutionError("x", retryable=True), 3, False),
        (3, StoreError("down"), 1, True),  # retryable by class
        (3, KeyboardInterrupt(), 1, False),
    ],
)
def test_should_retry(attempts: int, error: BaseException, attempt: int, expected: bool) -> None:
    policy = RetryPolicy(attempts=attempts, retry_on=(Flaky,))
    assert policy.should_retry(error, attempt) is expected


def test_retryable_is_read_from_the_field_not_the_message() -> None:
    policy = RetryPolicy(attempts=3)
    assert not policy.should_retry(ValueError("retryable=True, please retry"), 1)


@pytest.mark.parametrize(
    ("attempt", "expected_s"),
    [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 5.0), (50, 5.0)],
)
def test_delay_grows_geometrically_up_to_the_cap(attempt: int, expected_s: float) -> None:
    policy = RetryPolicy(attempts=100, backoff_s=0.5, multiplier=2.0, max_backoff_s=5.0)
    assert policy.delay_s(attempt) == expected_s


def test_constant_backoff_with_multiplier_one() -> None:
    policy = RetryPolicy(attempts=5, backoff_s=0.3, multiplier=1.0)
    assert [policy.delay_s(n) for n in (1, 2, 3)] == [0.3, 0.3, 0.3]


def test_delay_is_a_float() -> None:
    assert isinstance(RetryPolicy(backoff_s=1, max_backoff_s=10).delay_s(1), float)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempts": 0},
        {"attempts": -1},
        {"backoff_s": -0.1},
        {"max_backoff_s": -1.0},
        {"multiplier": 0.5},
    ],
)
def test_invalid_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs", [{"attempts": 1}, {"backoff_s": 0.0}, {"multiplier": 1.0}, {"max_backoff_s": 0.0}]
)
def test_boundary_policies_are_accepted(kwargs: dict[str, float]) -> None:
    policy = RetryPolicy(**kwargs)  # type: ignore[arg-type]
    assert {name: getattr(policy, name) for name in kwargs} == kwargs


@pytest.mark.parametrize(
    ("elapsed_s", "reason"),
    [
        (1.0, SyntheticReason.TIMEOUT_SOFT),  # interrupted at its own soft limit
        (1.7, SyntheticReason.TIMEOUT_SOFT),  # the pool's timer fired late under load
        (0.995, SyntheticReason.TIMEOUT_SOFT),  # within the clocks' slack
        (0.2, SyntheticReason.CRASHED),  # an earlier job's late interrupt, not this call's limit
    ],
)
def test_an_escaped_soft_limit_interrupt_is_a_timeout_once_the_soft_limit_passed(
    elapsed_s: float, reason: SyntheticReason
) -> None:
    # Given a call with a 1 s soft limit whose task started at 100 s
    # When the soft-limit interrupt ended the task outside the tool, elapsed_s later
    answered = escaped_soft_limit_reason(started_s=100.0, now_s=100.0 + elapsed_s, soft_s=1.0)
    # Then
    assert answered is reason
