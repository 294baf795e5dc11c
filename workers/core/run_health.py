"""The stuck-session watchdog's decisions: classify runs from their real activity, pick actions.

Classes follow OpenClaw, with its mistake avoided:
progress is *any* activity the ledger saw — a call submitted, started, finished, or a tool
heartbeat — not a narrow list of events, so a tool that keeps reporting is never stalled.

A run is judged from its record's summary (latest activity, unanswered and claimed call
counts, which the ledger keeps up to date with every call change), so a sweep reads one
record per run. Before alerting or acting, the sweep reads the run's calls and judges
again: a view with ``calls`` is judged from them, so a summary that drifted can never
get a run with live work recovered as stuck.

* ``active`` — recent activity, no unanswered call (the agent is between tool batches);
* ``long_running`` — unanswered calls and recent activity: work visible and progressing;
* ``stalled`` — a call is running (its worker's lease is alive) but nothing happened for
  ``stalled_after_ms``: alert only; its own limits still bound it;
* ``stuck`` — marked running, no running call, nothing for ``stalled_after_ms``: stale
  bookkeeping. Alerted, and recovered when ``auto_recover`` is on.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace

from workers.core.models import CallState

__all__ = [
    "CallActivity",
    "RunStatus",
    "RunVerdict",
    "RunView",
    "SessionClass",
    "WatchdogAction",
    "WatchdogPolicy",
    "classify",
    "judge",
    "judge_all",
    "last_activity_ms",
    "needs_confirmation",
    "watchdog_late",
]

LATE_SWEEP_FACTOR = 2
"""A watchdog is late once no sweep completed for this many sweep intervals."""


class RunStatus(enum.StrEnum):
    """Life cycle of a run."""

    RUNNING = "running"
    COMPLETED = "completed"
    ABORTED = "aborted"
    TIMED_OUT = "timed_out"


class SessionClass(enum.StrEnum):
    """What the watchdog thinks of a running run."""

    ACTIVE = "active"
    LONG_RUNNING = "long_running"
    STALLED = "stalled"
    STUCK = "stuck"


class WatchdogAction(enum.StrEnum):
    """What the sweep does with a run."""

    NONE = "none"
    TIME_OUT = "time_out"  # past its deadline: answer calls deadline_exceeded, free the lane
    RECOVER = "recover"  # stuck and auto_recover: cancel calls, revoke tasks, free the lane
    DROP = "drop"  # not running any more: remove it from the indexes


@dataclass(frozen=True)
class CallActivity:
    """What the ledger shows of one call of a run."""

    call_id: str
    tool: str
    state: CallState
    submitted_ms: int
    started_ms: int
    heartbeat_ms: int
    finished_ms: int
    lease_alive: bool
    dispatched: bool

    @property
    def open(self) -> bool:
        """Whether the call has no result yet."""
        return self.state is not CallState.DONE

    @property
    def working(self) -> bool:
        """Whether a live worker runs it right now."""
        return self.state is CallState.RUNNING and self.lease_alive

    @property
    def last_activity_ms(self) -> int:
        """The latest submit, start, heartbeat or finish of the call."""
        return max(self.submitted_ms, self.started_ms, self.heartbeat_ms, self.finished_ms)


@dataclass(frozen=True)
class RunView:
    """A run as the sweep sees it: its record's summary and, when they were read, its calls."""

    session_key: str
    run_id: str
    status: str
    started_ms: int
    deadline_ms: int
    progress_ms: int
    previous_class: str
    open_calls: int = 0  # calls without a result (the record's summary)
    claimed_calls: int = 0  # calls a worker claimed and has not answered (the record's summary)
    calls: tuple[CallActivity, ...] | None = None  # recent and open calls, when read: they win

    @property
    def has_open_call(self) -> bool:
        """Whether any call waits for a result."""
        if self.calls is None:
            return self.open_calls > 0
        return any(call.open for call in self.calls)

    @property
    def has_working_call(self) -> bool:
        """Whether a worker runs a call right now (from the calls when read: a live lease)."""
        if self.calls is None:
            return self.claimed_calls > 0
        return any(call.working for call in self.calls)

    def with_calls(self, calls: Iterable[CallActivity]) -> RunView:
        """The same run, judged from its calls instead of the summary."""
        return replace(self, calls=tuple(calls))


@dataclass(frozen=True)
class WatchdogPolicy:
    """The thresholds of one sweep."""

    stalled_after_ms: int
    auto_recover: bool = False


@dataclass(frozen=True)
class RunVerdict:
    """The watchdog's view of one run and what to do about it."""

    session_key: str
    run_id: str
    klass: SessionClass | None
    last_activity_ms: int
    idle_ms: int
    action: WatchdogAction
    alert: bool


def last_activity_ms(run: RunView) -> int:
    """The latest activity of the run: its recorded progress or any of its calls' activity."""
    return max([run.started_ms, run.progress_ms, *(call.last_activity_ms for call in run.calls or ())])


def classify(run: RunView, *, now_ms: int, stalled_after_ms: int) -> SessionClass:
    """Classify a running run; ``stalled``/``stuck`` start exactly at ``stalled_after_ms`` idle."""
    idle = now_ms - last_activity_ms(run)
    if idle < stalled_after_ms:
        return SessionClass.LONG_RUNNING if run.has_open_call else SessionClass.ACTIVE
    if run.has_working_call:
        return SessionClass.STALLED
    return SessionClass.STUCK


def judge(run: RunView, *, now_ms: int, policy: WatchdogPolicy) -> RunVerdict:
    """Class, alert (on entering stalled or stuck) and action of one run."""
    last = last_activity_ms(run)
    if run.status != RunStatus.RUNNING.value:
        return RunVerdict(run.session_key, run.run_id, None, last, now_ms - last, WatchdogAction.DROP, False)
    klass = classify(run, now_ms=now_ms, stalled_after_ms=policy.stalled_after_ms)
    alert = klass in (SessionClass.STALLED, SessionClass.STUCK) and run.previous_class != klass.value
    if run.deadline_ms and now_ms >= run.deadline_ms:
        action = WatchdogAction.TIME_OUT
    elif klass is SessionClass.STUCK and policy.auto_recover:
        action = WatchdogAction.RECOVER
    else:
        action = WatchdogAction.NONE
    return RunVerdict(run.session_key, run.run_id, klass, last, now_ms - last, action, alert)


def judge_all(runs: Iterable[RunView], *, now_ms: int, policy: WatchdogPolicy) -> list[RunVerdict]:
    """``judge`` for each run."""
    return [judge(run, now_ms=now_ms, policy=policy) for run in runs]


def needs_confirmation(verdict: RunVerdict) -> bool:
    """Whether a verdict reached from a summary must be confirmed from the calls before use.

    Steady classes are only stored; an alert or a recovery is confirmed first. A time-out is
    not: it depends on the deadline alone.
    """
    return verdict.alert or verdict.action is WatchdogAction.RECOVER


def watchdog_late(lag_ms: int, *, interval_ms: int) -> bool:
    """Whether the time since the last completed sweep shows a watchdog that fell behind."""
    return lag_ms > LATE_SWEEP_FACTOR * interval_ms
