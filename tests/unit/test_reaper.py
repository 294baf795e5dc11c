"""The reaper's decision table and the worker's verdict on running calls: pure functions of ``now``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from workers.core.heartbeats import ChildVerdict, RunningCall, judge_running_call
from workers.core.models import CallState, SyntheticReason
from workers.core.reaping import Action, ActionKind, OpenCall, decide, next_look_ms, past_first_look

NOW_MS = 1_000_000
MIN_RERUN_MS = 2_000
UNDISPATCHED_MS = 5_000

# A healthy running call: lease alive, deadline 10 s away, submitted 3 s ago.
LIVE = OpenCall(
    call_id="c1",
    tool="exec",
    state=CallState.RUNNING,
    deadline_ms=NOW_MS + 10_000,
    attempt=1,
    lease_alive=True,
    idempotent=False,
    dispatched=True,
    submitted_ms=NOW_MS - 3_000,
)

_ANSWER = ActionKind.ANSWER
_REQUEUE = ActionKind.REQUEUE
_R = SyntheticReason


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        # live calls are left alone
        ({}, None),
        ({"state": CallState.PENDING}, None),
        ({"state": CallState.PENDING, "dispatched": False, "submitted_ms": NOW_MS - 1}, None),
        ({"deadline_ms": NOW_MS + 1}, None),
        # past the deadline: answered, whatever else is true
        ({"deadline_ms": NOW_MS}, (_ANSWER, _R.DEADLINE_EXCEEDED)),
        ({"deadline_ms": NOW_MS - 1}, (_ANSWER, _R.DEADLINE_EXCEEDED)),
        ({"deadline_ms": NOW_MS, "lease_alive": False, "idempotent": True}, (_ANSWER, _R.DEADLINE_EXCEEDED)),
        (
            {"deadline_ms": NOW_MS, "state": CallState.PENDING, "dispatched": False},
            (_ANSWER, _R.DEADLINE_EXCEEDED),
        ),
        # running without a lease: the worker is gone
        ({"lease_alive": False}, (_ANSWER, _R.WORKER_LOST)),
        ({"lease_alive": False, "idempotent": True}, (_REQUEUE, None)),
        # ... re-run only when enough time is left (boundary at min_rerun_ms, inclusive)
        ({"lease_alive": False, "idempotent": True, "deadline_ms": NOW_MS + MIN_RERUN_MS}, (_REQUEUE, None)),
        (
            {"lease_alive": False, "idempotent": True, "deadline_ms": NOW_MS + MIN_RERUN_MS - 1},
            (_ANSWER, _R.WORKER_LOST),
        ),
        (
            {"lease_alive": False, "idempotent": False, "deadline_ms": NOW_MS + 10**6},
            (_ANSWER, _R.WORKER_LOST),
        ),
        # a pending call has no lease yet: not lost
        ({"state": CallState.PENDING, "lease_alive": False}, None),
        # never handed to the broker for too long
        (
            {"state": CallState.PENDING, "dispatched": False, "submitted_ms": NOW_MS - UNDISPATCHED_MS},
            (_ANSWER, _R.DISPATCH_FAILED),
        ),
        (
            {"state": CallState.PENDING, "dispatched": False, "submitted_ms": NOW_MS - UNDISPATCHED_MS + 1},
            None,
        ),
        (
            {"state": CallState.PENDING, "dispatched": True, "submitted_ms": NOW_MS - 10 * UNDISPATCHED_MS},
            None,
        ),
        (
            {"state": CallState.RUNNING, "dispatched": False, "submitted_ms": NOW_MS - 10 * UNDISPATCHED_MS},
            None,
        ),
    ],
)
def test_decide_table(
    changes: dict[str, object], expected: tuple[ActionKind, SyntheticReason | None] | None
) -> None:
    # Given
    call = replace(LIVE, **changes)  # type: ignore[arg-type]
    # When
    actions = decide([call], now_ms=NOW_MS, min_rerun_ms=MIN_RERUN_MS, undispatched_after_ms=UNDISPATCHED_MS)
    # Then
    if expected is None:
        assert actions == []
    else:
        assert [(a.kind, a.reason) for a in actions] == [expected]
        assert actions[0].call_id == call.call_id


def test_action_carries_elapsed_and_attempt() -> None:
    call = replace(LIVE, lease_alive=False, attempt=2, submitted_ms=NOW_MS - 4_321)
    assert decide([call], now_ms=NOW_MS, min_rerun_ms=MIN_RERUN_MS) == [
        Action("c1", ActionKind.ANSWER, SyntheticReason.WORKER_LOST, 4_321, 2)
    ]


def test_elapsed_is_never_negative() -> None:
    # A submission stamp from a host whose clock runs ahead.
    call = replace(LIVE, deadline_ms=NOW_MS - 1, submitted_ms=NOW_MS + 500)
    assert decide([call], now_ms=NOW_MS, min_rerun_ms=MIN_RERUN_MS)[0].elapsed_ms == 0


def test_undispatched_rule_is_off_without_a_threshold() -> None:
    call = replace(LIVE, state=CallState.PENDING, dispatched=False, submitted_ms=0)
    assert decide([call], now_ms=NOW_MS, min_rerun_ms=MIN_RERUN_MS) == []


REPUBLISH_MS = 4_000
# Published 3 s ago, claimed by nobody since: what a message lost in a killed worker looks like.
QUEUED = replace(LIVE, state=CallState.PENDING, attempt=0, lease_alive=False)


@pytest.mark.parametrize(
    ("changes", "republished"),
    [
        ({}, False),  # 3 s in the queue: not yet one republish interval
        ({"submitted_ms": NOW_MS - REPUBLISH_MS}, True),  # boundary, inclusive
        ({"submitted_ms": NOW_MS - REPUBLISH_MS + 1}, False),
        # requeued or republished since submission: the wait counts from then
        ({"submitted_ms": 0, "queued_ms": NOW_MS - REPUBLISH_MS + 1}, False),
        ({"submitted_ms": 0, "queued_ms": NOW_MS - REPUBLISH_MS}, True),
        # each republish doubles the wait: a real backlog gets few copies
        ({"queued_ms": NOW_MS - 2 * REPUBLISH_MS + 1, "republishes": 1}, False),
        ({"queued_ms": NOW_MS - 2 * REPUBLISH_MS, "republishes": 1}, True),
        ({"queued_ms": NOW_MS - 8 * REPUBLISH_MS + 1, "republishes": 3}, False),
        ({"queued_ms": NOW_MS - 8 * REPUBLISH_MS, "republishes": 3}, True),
        # a requeued call (earlier attempts) whose new message is lost
        ({"attempt": 2, "queued_ms": NOW_MS - REPUBLISH_MS}, True),
        # claimed since, leased, or never published: not a lost message
        ({"submitted_ms": 0, "state": CallState.RUNNING, "lease_alive": True}, False),
        ({"submitted_ms": 0, "lease_alive": True}, False),
        ({"submitted_ms": NOW_MS - REPUBLISH_MS, "dispatched": False}, False),
    ],
)
def test_an_unclaimed_message_is_published_again_after_a_doubling_wait(
    changes: dict[str, object], republished: bool
) -> None:
    # Given
    call = replace(QUEUED, **changes)  # type: ignore[arg-type]
    # When
    actions = decide([call], now_ms=NOW_MS, min_rerun_ms=MIN_RERUN_MS, republish_after_ms=REPUBLISH_MS)
    # Then
    assert [a.kind for a in actions] == ([ActionKind.REPUBLISH] if republished else [])


def test_without_a_republish_interval_a_lost_message_waits_for_its_deadline() -> None:
    # The watchdog publishes nothing: it passes no interval, and answers at the deadline.
    call = replace(QUEUED, submitted_ms=0)
    assert decide([call], now_ms=NOW_MS, min_rerun_ms=MIN_RERUN_MS) == []
    overdue = replace(call, deadline_ms=NOW_MS)
    assert [a.reason for a in decide([overdue], now_ms=NOW_MS, min_rerun_ms=MIN_RERUN_MS)] == [
        SyntheticReason.DEADLINE_EXCEEDED
    ]


def test_decide_keeps_input_order_and_skips_live_calls() -> None:
    # Given
    calls = [
        replace(LIVE, call_id="late", deadline_ms=NOW_MS - 1),
        replace(LIVE, call_id="fine"),
        replace(LIVE, call_id="lost", lease_alive=False),
        replace(LIVE, call_id="rerun", lease_alive=False, idempotent=True),
    ]
    # When
    actions = decide(iter(calls), now_ms=NOW_MS, min_rerun_ms=MIN_RERUN_MS)
    # Then
    assert [(a.call_id, a.kind) for a in actions] == [
        ("late", ActionKind.ANSWER),
        ("lost", ActionKind.ANSWER),
        ("rerun", ActionKind.REQUEUE),
    ]


# --- the worker main process's verdict on calls its children run -----------------------------
# (workers.core.heartbeats replaced stale_heartbeats with judge_running_call.)

HOST = "host-a"
RUNNING = RunningCall(state="running", worker=f"{HOST}:4242", last_beat_ms=NOW_MS, heartbeat_timeout_s=1.0)


@pytest.mark.parametrize(
    ("changes", "child_alive", "expected"),
    [
        ({}, True, ChildVerdict.RENEW),
        ({"state": "pending"}, True, ChildVerdict.IGNORE),
        ({"state": "done"}, False, ChildVerdict.IGNORE),
        ({"worker": "host-b:4242"}, False, ChildVerdict.IGNORE),  # another host's call
        ({"worker": "host-a-2:4242"}, False, ChildVerdict.IGNORE),  # a prefix is not the same host
        ({}, False, ChildVerdict.CHILD_DIED),
        ({"last_beat_ms": 0}, False, ChildVerdict.CHILD_DIED),  # a dead child beats a stale heartbeat
        # heartbeat boundaries: exactly at the timeout is still alive
        ({"last_beat_ms": NOW_MS - 1_000}, True, ChildVerdict.RENEW),
        ({"last_beat_ms": NOW_MS - 1_001}, True, ChildVerdict.HEARTBEAT_STALE),
        ({"last_beat_ms": NOW_MS - 250, "heartbeat_timeout_s": 0.25}, True, ChildVerdict.RENEW),
        ({"last_beat_ms": NOW_MS - 251, "heartbeat_timeout_s": 0.25}, True, ChildVerdict.HEARTBEAT_STALE),
        ({"last_beat_ms": NOW_MS + 5_000}, True, ChildVerdict.RENEW),  # beat stamped ahead (clock skew)
        # no heartbeat timeout declared: silence is fine
        ({"last_beat_ms": 0, "heartbeat_timeout_s": None}, True, ChildVerdict.RENEW),
    ],
)
def test_judge_running_call(changes: dict[str, object], child_alive: bool, expected: ChildVerdict) -> None:
    # Given
    call = replace(RUNNING, **changes)  # type: ignore[arg-type]
    # When
    verdict = judge_running_call(call, host=HOST, child_alive=child_alive, now_ms=NOW_MS)
    # Then
    assert verdict is expected


def test_host_names_may_contain_colons() -> None:
    call = replace(RUNNING, worker="[::1]:99")
    assert judge_running_call(call, host="[::1]", child_alive=True, now_ms=NOW_MS) is ChildVerdict.RENEW


def test_a_call_is_first_looked_at_one_lease_after_submission_unless_its_deadline_is_sooner() -> None:
    assert next_look_ms(deadline_ms=100_000, submitted_ms=1_000, lease_ms=10_000) == 11_000
    assert next_look_ms(deadline_ms=5_000, submitted_ms=1_000, lease_ms=10_000) == 5_000


@pytest.mark.parametrize(
    ("now_ms", "submitted_ms", "expected"),
    [(1000, 1000, False), (5999, 1000, False), (6000, 1000, True), (900, 1000, False), (1, None, True)],
)
def test_past_first_look_from_half_a_lease_after_submission(
    now_ms: int, submitted_ms: int | None, expected: bool
) -> None:
    assert past_first_look(now_ms=now_ms, submitted_ms=submitted_ms, lease_ms=10_000) is expected
