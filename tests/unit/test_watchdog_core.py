"""Table-driven tests of the watchdog's pure decisions: classes, boundaries, alerts, actions."""

from __future__ import annotations

import pytest

from workers.core.models import CallState
from workers.core.run_health import (
    CallActivity,
    RunView,
    SessionClass,
    WatchdogAction,
    WatchdogPolicy,
    classify,
    judge,
    last_activity_ms,
    needs_confirmation,
)

STALL_MS = 120_000
T0 = 1_000_000


def call(
    state: str = "running",
    *,
    submitted: int = T0,
    started: int = 0,
    hb: int = 0,
    finished: int = 0,
    lease: bool = True,
) -> CallActivity:
    return CallActivity("c1", "exec", CallState(state), submitted, started, hb, finished, lease, True)


def run(
    *calls: CallActivity, progress: int = T0, status: str = "running", prev: str = "", deadline: int = 0
) -> RunView:
    return RunView("s1", "r1", status, T0, deadline or T0 + 10**9, progress, prev, calls=tuple(calls))


@pytest.mark.parametrize(
    ("name", "view", "now", "expected"),
    [
        ("fresh run, no calls", run(), T0 + 1, SessionClass.ACTIVE),
        ("between batches, just under", run(), T0 + STALL_MS - 1, SessionClass.ACTIVE),
        ("nothing at all, exactly at the threshold", run(), T0 + STALL_MS, SessionClass.STUCK),
        ("open call, recent start", run(call(started=T0 + 5)), T0 + 10, SessionClass.LONG_RUNNING),
        (
            "a long tool that heartbeats is never stalled",
            run(call(started=T0, hb=T0 + 10 * STALL_MS)),
            T0 + 10 * STALL_MS + STALL_MS - 1,
            SessionClass.LONG_RUNNING,
        ),
        ("running, silent, just under", run(call(started=T0)), T0 + STALL_MS - 1, SessionClass.LONG_RUNNING),
        ("running, silent, at the threshold", run(call(started=T0)), T0 + STALL_MS, SessionClass.STALLED),
        (
            "lease gone: nothing really runs",
            run(call(started=T0, lease=False)),
            T0 + STALL_MS,
            SessionClass.STUCK,
        ),
        ("queued call nobody runs", run(call("pending")), T0 + STALL_MS, SessionClass.STUCK),
        (
            "a finished call is progress",
            run(call("done", started=T0, finished=T0 + STALL_MS)),
            T0 + STALL_MS + 1,
            SessionClass.ACTIVE,
        ),
        ("recorded progress counts", run(progress=T0 + STALL_MS), T0 + STALL_MS + 1, SessionClass.ACTIVE),
    ],
)
def test_classify(name: str, view: RunView, now: int, expected: SessionClass) -> None:
    assert classify(view, now_ms=now, stalled_after_ms=STALL_MS) is expected, name


def test_last_activity_is_the_latest_of_every_signal() -> None:
    view = run(call(submitted=T0 + 1, started=T0 + 2, hb=T0 + 7, finished=0), progress=T0 + 3)
    assert last_activity_ms(view) == T0 + 7


@pytest.mark.parametrize(
    ("view", "now", "recover", "action", "alert"),
    [
        (run(), T0 + STALL_MS, False, WatchdogAction.NONE, True),
        (run(), T0 + STALL_MS, True, WatchdogAction.RECOVER, True),
        (run(prev="stuck"), T0 + STALL_MS, True, WatchdogAction.RECOVER, False),
        (run(call(started=T0)), T0 + STALL_MS, True, WatchdogAction.NONE, True),  # stalled: never killed
        (run(call(started=T0), prev="stalled"), T0 + STALL_MS, False, WatchdogAction.NONE, False),
        (run(deadline=T0 + 5), T0 + 5, False, WatchdogAction.TIME_OUT, False),
        (run(call(hb=T0 + 4), deadline=T0 + 5), T0 + 5, True, WatchdogAction.TIME_OUT, False),
        (run(status="completed"), T0 + STALL_MS, True, WatchdogAction.DROP, False),
    ],
)
def test_judge(view: RunView, now: int, recover: bool, action: WatchdogAction, alert: bool) -> None:
    # Given
    policy = WatchdogPolicy(STALL_MS, auto_recover=recover)
    # When
    verdict = judge(view, now_ms=now, policy=policy)
    # Then
    assert (verdict.action, verdict.alert) == (action, alert)


def test_alert_again_when_the_class_changes() -> None:
    # Given a run alerted as stalled whose worker then vanished
    view = run(call(started=T0, lease=False), prev="stalled")
    # When
    verdict = judge(view, now_ms=T0 + STALL_MS, policy=WatchdogPolicy(STALL_MS))
    # Then
    assert verdict.klass is SessionClass.STUCK
    assert verdict.alert


def summary(*, open_calls: int = 0, claimed: int = 0, progress: int = T0, prev: str = "") -> RunView:
    return RunView("s1", "r1", "running", T0, T0 + 10**9, progress, prev, open_calls, claimed)


@pytest.mark.parametrize(
    ("name", "view", "now", "expected"),
    [
        ("nothing open, recent", summary(), T0 + STALL_MS - 1, SessionClass.ACTIVE),
        ("an open call, recent", summary(open_calls=1), T0 + STALL_MS - 1, SessionClass.LONG_RUNNING),
        ("a claimed call, quiet", summary(open_calls=1, claimed=1), T0 + STALL_MS, SessionClass.STALLED),
        ("only queued calls, quiet", summary(open_calls=2), T0 + STALL_MS, SessionClass.STUCK),
        (
            "heartbeats raised progress",
            summary(open_calls=1, claimed=1, progress=T0 + STALL_MS),
            T0 + STALL_MS + 1,
            SessionClass.LONG_RUNNING,
        ),
    ],
)
def test_classify_from_the_record_summary(name: str, view: RunView, now: int, expected: SessionClass) -> None:
    assert classify(view, now_ms=now, stalled_after_ms=STALL_MS) is expected, name


def test_calls_once_read_win_over_the_summary() -> None:
    # Given a summary that says nobody holds a call, while a call runs under a live lease
    drifted = summary(open_calls=1, claimed=0)
    # When the calls are read
    confirmed = drifted.with_calls([call(started=T0)])
    # Then the run is stalled (alive), not stuck
    assert classify(drifted, now_ms=T0 + STALL_MS, stalled_after_ms=STALL_MS) is SessionClass.STUCK
    assert classify(confirmed, now_ms=T0 + STALL_MS, stalled_after_ms=STALL_MS) is SessionClass.STALLED


@pytest.mark.parametrize(
    ("view", "recover", "confirm"),
    [
        (summary(), False, True),  # entering stuck: alert
        (summary(prev="stuck"), False, False),  # already alerted, nothing to do
        (summary(prev="stuck"), True, True),  # recovery
        (summary(open_calls=1, claimed=1, prev="stalled"), True, False),  # stalled: never recovered
    ],
)
def test_alerts_and_recoveries_need_confirmation(view: RunView, recover: bool, confirm: bool) -> None:
    verdict = judge(view, now_ms=T0 + STALL_MS, policy=WatchdogPolicy(STALL_MS, auto_recover=recover))
    assert needs_confirmation(verdict) is confirm
