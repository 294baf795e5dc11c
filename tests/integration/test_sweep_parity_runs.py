"""The watchdog's run judgement exists once: ``sweep_runs.lua`` is checked against the pure table.

On a single Redis node a sweep settles steady runs inside ``sweep_runs.lua`` and hands the rest
back; on a cluster it reads every due run pipelined and judges it with :func:`judge` (confirming
alerts and recoveries from the calls). Every combination of the inputs these judgements branch on
is generated (``RUN_TABLES``), written once through the store's write paths, copied to one
prefix per path (:mod:`tests.integration.sweep_parity`), swept, and checked case by case:

* each path against the pure decision computed from the case itself: class, alert, action, its
  call, its index scores, its lane;
* the script against :func:`judge` of the run's summary: which runs it hands back;
* the two paths against each other, down to every key, index member and alert of the case.

Inputs: status (running, ended three ways, no status, record gone), deadline (none, one ms
ahead, exactly now, past), idle time (one ms under, exactly at, twice ``stalled_after``), where
the latest activity is recorded (``progress_ms`` missing, newer than or equal to ``started_ms``),
the summary counts ``open_n``/``claimed_n``, the class the last sweep stored, ``auto_recover``,
the progress index score (exactly at the quiet boundary, or one ms after), the call read to
confirm an alert or a recovery (none, queued, running with or without a live lease, answered,
heartbeat newer than the summary) and the lane (held, free, held by a newer run).

Written directly, because no write path leaves them so on purpose: the summary (so it can drift
from the calls), the progress index score, a lease's expiry and the lane. The run phase is swept
alone: the call indexes are emptied, so the calls stay as written for the run judgement.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
import redis

from tests.integration.sweep_parity import (
    ALIVE_MS,
    CALL,
    FAR_MS,
    NOW,
    PATHS,
    RUN,
    STALL_MS,
    RecordingScripts,
    RecordingSink,
    Swept,
    clients,
    copy_prefix,
    dump,
    mutant,
    ok_result,
    product,
    session_store,
    sweep_settings,
)
from workers.core.models import CallState, SyntheticReason
from workers.core.run_health import (
    CallActivity,
    RunStatus,
    RunVerdict,
    RunView,
    SessionClass,
    WatchdogAction,
    WatchdogPolicy,
    judge,
    needs_confirmation,
)
from workers.local.embedded_redis import EmbeddedRedis
from workers.store.keys import RunKeys, all_index_keys, run_member
from workers.store.ledger import Ledger
from workers.store.sessions import SessionStore
from workers.watchdog.sweep import SweepReport, Watchdog

# The first test builds the module fixture, a sweep of every stored case by every path; under
# a loaded parallel run that alone can pass the suite-wide 120 s.
pytestmark = pytest.mark.timeout(600)

NEWER_RUN = "r-newer"

DEADLINES = {"none": 0, "ahead": NOW + 1, "now": NOW, "past": NOW - 1}
IDLE = {"S-1": STALL_MS - 1, "S": STALL_MS, "2S": 2 * STALL_MS}
# progress_ms against started_ms. Never older: session_start writes it no earlier than
# started_ms and no writer lowers it (tests/integration/test_sessions.py), which lets the
# script read progress_ms alone.
PROGRESS = ("absent", "newer", "equal")
INDEXED = {"quiet": NOW - STALL_MS, "recent": NOW - STALL_MS + 1}  # by_progress score
CLASSES = ("", *(k.value for k in SessionClass))
RUN_CALLS = ("summary", "none", "pending", "running", "lost", "done", "beat")
ENDED = ("completed", "aborted", "timed_out")


@dataclass(frozen=True)
class RunCase:
    """One row of the run table: the run record, its calls and its lane as written."""

    status: str = "running"  # running | completed | aborted | timed_out | no_status | gone
    deadline: str = "ahead"
    idle: str = "S"
    progress: str = "newer"
    open_n: int = 0
    claimed_n: int = 0
    previous: str = ""
    recover: bool = False
    indexed: str = "quiet"
    calls: str = "summary"  # summary: the call the summary counts describe
    lane: str = "held"  # held | free | other (a newer run of the session holds it)

    @property
    def id(self) -> str:
        return (
            f"{self.status}-deadline:{self.deadline}-idle:{self.idle}-progress:{self.progress}"
            f"-open:{self.open_n}-claimed:{self.claimed_n}-prev:{self.previous or 'none'}"
            f"-{'recover' if self.recover else 'alert_only'}-index:{self.indexed}-calls:{self.calls}"
            f"-lane:{self.lane}"
        )

    @property
    def last_ms(self) -> int:
        """The latest activity the record shows (the later of start and progress)."""
        return NOW - IDLE[self.idle]

    @property
    def started_ms(self) -> int:
        return self.last_ms - STALL_MS if self.progress == "newer" else self.last_ms

    @property
    def progress_ms(self) -> int | None:
        return None if self.progress == "absent" else self.last_ms

    @property
    def call(self) -> str:
        """The call written: ``summary`` picks the one the counts describe (or drift from)."""
        if self.calls != "summary":
            return self.calls
        if self.claimed_n:
            return "running"
        return "pending" if self.open_n else "done"

    @property
    def due(self) -> bool:
        """Whether a sweep reads the run: past its deadline or quiet in the progress index."""
        return DEADLINES[self.deadline] <= NOW or INDEXED[self.indexed] <= NOW - STALL_MS


RUN_TABLES: list[dict[str, Iterable[Any]]] = [
    # every summary the script reads, with the call it describes (deadlines at the boundary)
    {
        "deadline": ("none", "ahead", "now"),
        "idle": IDLE,
        "progress": PROGRESS,
        "open_n": (0, 1),
        "claimed_n": (0, 1),
        "previous": CLASSES,
        "recover": (False, True),
        "indexed": INDEXED,
    },
    # every call that confirms (or overturns) an alert or a recovery
    {
        "calls": RUN_CALLS[1:],
        "open_n": (0, 1),
        "claimed_n": (0, 1),
        "idle": IDLE,
        "previous": ("", "stalled", "stuck"),
        "recover": (False, True),
        "deadline": ("none", "now"),
    },
    # runs no longer running, or whose record is gone
    {
        "status": (*ENDED, "no_status", "gone"),
        "deadline": DEADLINES,
        "idle": IDLE,
        "indexed": INDEXED,
        "recover": (False, True),
    },
    # lanes, where a run is ended
    {
        "lane": ("held", "free", "other"),
        "calls": ("none", "pending", "lost"),
        "idle": ("S-1", "S"),
        "deadline": ("none", "now"),
        "recover": (False, True),
    },
]
RUN_CASES = list(dict.fromkeys(RunCase(**row) for table in RUN_TABLES for row in product(**table)))
CASE_NUMBER = {case: n for n, case in enumerate(RUN_CASES)}
# What is stored does not depend on auto_recover (a sweep's policy): each stored run is swept
# once with it off and once with it on, and so stands for two cases.
STORED_RUNS = list(dict.fromkeys(replace(case, recover=False) for case in RUN_CASES))
assert len(RUN_CASES) == 2 * len(STORED_RUNS)


def _activity(case: RunCase) -> tuple[CallActivity, ...]:
    """The call as written, as the watchdog should read it."""
    t, kind = case.last_ms, case.call
    if kind == "none":
        return ()
    if kind == "pending":
        return (CallActivity(CALL, "echo", CallState.PENDING, t, 0, 0, 0, False, True),)
    if kind == "done":
        return (CallActivity(CALL, "echo", CallState.DONE, t, t, t, t, False, True),)
    beat = NOW - 1 if kind == "beat" else t
    return (CallActivity(CALL, "echo", CallState.RUNNING, t, t, beat, 0, kind != "lost", True),)


def _summary(case: RunCase) -> RunView:
    status = {"no_status": "", "gone": ""}.get(case.status, case.status)
    return RunView(
        "s", RUN, status, case.started_ms, DEADLINES[case.deadline],
        case.progress_ms or 0, case.previous, case.open_n, case.claimed_n,
    )  # fmt: skip


def pure_verdict(case: RunCase) -> RunVerdict:
    """The pure decision: judged from the summary, confirmed from the calls when it must be."""
    policy = WatchdogPolicy(STALL_MS, case.recover)
    verdict = judge(_summary(case), now_ms=NOW, policy=policy)
    if needs_confirmation(verdict):
        verdict = judge(_summary(case).with_calls(_activity(case)), now_ms=NOW, policy=policy)
    return verdict


def script_hands_back(case: RunCase) -> bool:
    """Whether the script must return the run: anything but a running run judged steady.

    A run past its deadline (by its index score) is returned unread, and so is one without
    ``progress_ms``: the caller judges both from the whole record.
    """
    if not case.due:
        return False
    if DEADLINES[case.deadline] <= NOW or case.status != "running" or case.progress_ms is None:
        return True
    verdict = judge(_summary(case), now_ms=NOW, policy=WatchdogPolicy(STALL_MS, case.recover))
    return needs_confirmation(verdict) or verdict.action is not WatchdogAction.NONE


@dataclass(frozen=True)
class RunOutcome:
    """What a sweep leaves of a run: its record, indexes, call, lane and alert."""

    klass: str | None
    alert: bool
    status: str | None
    end_reason: str | None
    by_deadline: bool
    by_progress: int | None
    ended: bool
    call: tuple[str | None, str | None]
    lane: str | None


def _as_written(case: RunCase) -> RunOutcome:
    gone = case.status == "gone"
    call_state = {"none": None, "pending": "pending", "done": "done"}.get(case.call, "running")
    return RunOutcome(
        klass=None if gone else case.previous or None,
        alert=False,
        status=None if case.status in ("gone", "no_status") else case.status,
        end_reason="ended" if case.status in ENDED else None,
        by_deadline=True,
        by_progress=INDEXED[case.indexed],
        ended=False,
        call=(call_state, "" if call_state == "done" else None),
        lane={"held": RUN, "free": None, "other": NEWER_RUN}[case.lane],
    )


def expected_run(case: RunCase, verdict: RunVerdict | None = None) -> RunOutcome:
    """What the sweep must leave, from the pure verdict (``verdict`` overrides it)."""
    before = _as_written(case)
    if not case.due:
        return before
    if case.status == "gone":
        return replace(before, by_deadline=False, by_progress=None)
    verdict = verdict or pure_verdict(case)
    if verdict.action is WatchdogAction.DROP:
        return replace(before, by_deadline=False, by_progress=None)
    assert verdict.klass is not None
    after = replace(before, klass=verdict.klass.value, alert=verdict.alert)
    if verdict.action is WatchdogAction.NONE:
        if verdict.klass in (SessionClass.ACTIVE, SessionClass.LONG_RUNNING):
            return replace(after, by_progress=max(INDEXED[case.indexed], verdict.last_activity_ms))
        return after
    timed_out = verdict.action is WatchdogAction.TIME_OUT
    status = RunStatus.TIMED_OUT if timed_out else RunStatus.ABORTED
    reason = SyntheticReason.DEADLINE_EXCEEDED if timed_out else SyntheticReason.CANCELLED
    call = ("done", reason.value) if before.call[0] in ("pending", "running") else before.call
    return replace(
        after, status=status.value, end_reason=reason.value, by_deadline=False, by_progress=None,
        ended=True, call=call, lane=None if case.lane == "held" else before.lane,
    )  # fmt: skip


def _write_run_call(ledger: Ledger, keys: RunKeys, kind: str, t: int) -> None:
    if kind == "none":
        return
    ledger.register_call(
        keys,
        CALL,
        now_ms=t,
        deadline_ms=FAR_MS,
        fields={"tool": "echo", "dispatched": "1", "job_digest": "d"},
    )
    if kind == "pending":
        return
    ledger.claim(keys, CALL, worker_id="w:1", now_ms=t, tool="echo", job_digest="d")
    if kind == "done":
        ledger.finish(keys, ok_result(CALL), now_ms=t, writer="w:1")
    elif kind == "lost":
        ledger.client.delete(keys.lease(CALL))
    else:
        if kind == "beat":
            ledger.heartbeat(keys, CALL, now_ms=NOW - 1, details={"step": 1})
        ledger.client.pexpire(keys.lease(CALL), ALIVE_MS)


def write_run(store: SessionStore, n: int, case: RunCase) -> None:
    """Write one stored run under ``store``'s prefix, in session ``s<n>``."""
    session, client = f"s{n}", store.client
    keys = store.ledger.keys(session, RUN)
    token = store.begin_run(session, RUN, "main", case.started_ms, DEADLINES[case.deadline])
    _write_run_call(store.ledger, keys, case.call, case.last_ms)
    # The summary as the case has it (it may drift from the calls), the progress index score
    # and the lane: written directly, no write path leaves them so on purpose.
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.run, mapping={"open_n": case.open_n, "claimed_n": case.claimed_n})
    if case.progress_ms is None:
        pipe.hdel(keys.run, "progress_ms")
    else:
        pipe.hset(keys.run, "progress_ms", case.progress_ms)
    if case.previous:
        pipe.hset(keys.run, "class", case.previous)
    else:
        pipe.hdel(keys.run, "class")
    pipe.zadd(keys.index.by_progress, {run_member(session, RUN): INDEXED[case.indexed]})
    lane = store.session(session).lane
    pipe.delete(lane)
    if case.lane != "free":
        holder, held = (RUN, token) if case.lane == "held" else (NEWER_RUN, token + 1)
        since, until = case.started_ms, FAR_MS
        pipe.hset(
            lane,
            mapping={
                "run_id": holder,
                "token": held,
                "agent_id": "main",
                "since_ms": since,
                "lease_until_ms": until,
            },
        )
        pipe.pexpire(lane, ALIVE_MS)
    pipe.execute()
    if case.status in ENDED:
        store.end_run(session, RUN, RunStatus(case.status), case.last_ms, reason="ended", release=False)
    elif case.status == "no_status":
        client.hdel(keys.run, "status")
    elif case.status == "gone":
        client.delete(keys.run)


RUNS_BOUNDARY = ("if last > fresh_after then", "if last >= fresh_after then")  # idle < vs <= stalled


def _observe_runs(store: SessionStore, sink: RecordingSink) -> dict[int, RunOutcome]:
    """What the sweep left of each stored run, by its number in ``STORED_RUNS``."""
    numbers = range(len(STORED_RUNS))
    pipe = store.client.pipeline(transaction=False)
    for n in numbers:
        keys, member = store.ledger.keys(f"s{n}", RUN), run_member(f"s{n}", RUN)
        pipe.hmget(keys.run, ["class", "status", "end_reason"])
        pipe.zscore(keys.index.by_deadline, member)
        pipe.zscore(keys.index.by_progress, member)
        pipe.zscore(keys.index.ended, member)
        pipe.hmget(keys.call(CALL), ["state", "reason"])
        pipe.hget(store.session(f"s{n}").lane, "run_id")
    rows = pipe.execute()
    out: dict[int, RunOutcome] = {}
    for i, n in enumerate(numbers):
        (klass, status, reason), deadline, progress, ended, call, lane = rows[6 * i : 6 * i + 6]
        out[n] = RunOutcome(
            klass, bool(sink.by_session.get(f"s{n}")), status, reason, deadline is not None,
            None if progress is None else int(progress), ended is not None, tuple(call), lane,
        )  # fmt: skip
    return out


def _sweep(store: SessionStore, path: str, recover: bool) -> tuple[SweepReport, RecordingSink, set[int]]:
    """One sweep by ``path``; returns its report, its alerts and the stored runs the script handed back."""
    sink = RecordingSink()
    watchdog = Watchdog(
        store, sweep_settings(recover), writer="wd", alerts=sink, server_side=path != "pipelined"
    )
    scripts = None
    if path != "pipelined":
        runs_lua = mutant("sweep_runs.lua", *RUNS_BOUNDARY) if path == "mutant" else ""
        watchdog.scripts = scripts = RecordingScripts(store.ledger, runs_lua=runs_lua)
    report = watchdog.sweep(NOW)
    report.phases_ms.clear()
    back = {int(session[1:]) for session, _ in scripts.handed_back} if scripts else set()
    return report, sink, back


def _sweep_into(into: Swept, client: redis.Redis, prefix: str, path: str, recover: bool) -> None:
    """Sweep the copy under ``prefix`` and file what it left by case number."""
    store = session_store(client, prefix)
    report, sink, back = _sweep(store, path, recover)
    number = {m: CASE_NUMBER[replace(case, recover=recover)] for m, case in enumerate(STORED_RUNS)}
    into.outcomes.update({number[m]: seen for m, seen in _observe_runs(store, sink).items()})
    into.handed_back |= {number[m] for m in back}
    if path == "mutant":
        return
    owned, shared = dump(client, prefix)
    for m, n in number.items():
        into.states[n] = {**owned.get(m, {}), "alerts": sink.by_session.get(f"s{m}", [])}
    into.shared[f"recover={recover}"] = (report, shared)


@pytest.fixture(scope="module")
def run_sweeps(redis_server: EmbeddedRedis) -> Iterator[dict[str, Swept]]:
    """Every run case, swept by each path: the runs written once, swept per ``auto_recover``."""
    with clients(redis_server.url) as (client, raw):
        store = session_store(client, "runs")
        for m, case in enumerate(STORED_RUNS):
            write_run(store, m, case)
        client.delete(*(k for b in all_index_keys("runs") for k in (b.due, b.leases)))  # the run phase alone
        swept = {path: Swept() for path in PATHS}
        for recover, path in itertools.product((False, True), PATHS):
            if path == "mutant" and recover:
                continue  # one policy is enough to show the boundary rows catch it
            prefix = f"runs-{path}-{'recover' if recover else 'alert'}"
            copy_prefix(raw, "runs", prefix)
            _sweep_into(swept[path], client, prefix, path, recover)
        yield swept


@pytest.mark.parametrize("n", range(len(RUN_CASES)), ids=[case.id for case in RUN_CASES])
def test_both_sweep_paths_judge_each_run_as_the_pure_table(run_sweeps: dict[str, Swept], n: int) -> None:
    # Given one generated run, swept by the script path and by the pipelined path
    case, scripts, pipelined = RUN_CASES[n], run_sweeps["scripts"], run_sweeps["pipelined"]
    # Then each did what the pure decision says, and left exactly the same keys
    expected = expected_run(case)
    assert scripts.outcomes[n] == expected
    assert pipelined.outcomes[n] == expected
    assert (n in scripts.handed_back) is script_hands_back(case)
    assert scripts.states[n] == pipelined.states[n]


def test_both_sweep_paths_report_the_same_run_sweeps(run_sweeps: dict[str, Swept]) -> None:
    assert run_sweeps["scripts"].shared == run_sweeps["pipelined"].shared
    reports = [report for report, _ in run_sweeps["scripts"].shared.values()]
    assert all(report.classes and report.dropped and report.timed_out for report in reports)
    assert [bool(report.recovered) for report in reports] == [False, True]


def test_an_altered_expected_action_is_detected(run_sweeps: dict[str, Swept]) -> None:
    # Given the pure table with one action altered: time-outs expected as no action
    def altered(case: RunCase) -> RunOutcome:
        verdict = pure_verdict(case)
        if verdict.action is WatchdogAction.TIME_OUT:
            verdict = replace(verdict, action=WatchdogAction.NONE)
        return expected_run(case, verdict)

    timed_out = {
        n for n, case in enumerate(RUN_CASES) if case.due and case.status == "running"
        and pure_verdict(case).action is WatchdogAction.TIME_OUT
    }  # fmt: skip
    # When both paths' outcomes are compared with it
    for path in ("scripts", "pipelined"):
        outcomes = run_sweeps[path].outcomes
        wrong = {n for n, case in enumerate(RUN_CASES) if outcomes[n] != altered(case)}
        # Then exactly the altered rows fail
        assert wrong == timed_out
    assert len(timed_out) > 100


def test_a_script_with_the_stall_boundary_moved_is_detected(run_sweeps: dict[str, Swept]) -> None:
    # Given the run script judging "idle <= stalled_after" as not yet stalled (the mutant path)
    outcomes = run_sweeps["mutant"].outcomes
    # When its outcomes are compared with the pure table
    wrong = [case for n, case in enumerate(RUN_CASES) if n in outcomes and outcomes[n] != expected_run(case)]
    # Then rows fail, and only rows exactly at the boundary
    assert wrong
    assert {case.idle for case in wrong} == {"S"}
