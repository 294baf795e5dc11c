"""The run phase with the decision in Python only: the prototype ``sweep_runs.lua`` is measured against.

``BENCH_PATH=python-judge python -m bench.watchdog`` sweeps with it. Redis only moves data:
one script per bucket page ranges the due runs by score and returns each quiet run's five
summary fields (it decides nothing); :func:`workers.core.run_health.judge` classifies every
run in Python (``BENCH_LEAN=1``: a plain function of the summary's values, what a lean core
function would be); one pipeline then stores changed classes and moves the active runs
forward in the progress index (``ZADD XX GT``, so a run that progressed meanwhile is never
moved back). The runs that need an alert, an action or a drop are handed back as the script
path hands them back. Paging is the script path's: a bucket whose page came back full is
read again, skipping what stayed in its ranges.
"""

from __future__ import annotations

import os
from typing import Any

from workers.core.run_health import RunView, WatchdogPolicy, judge, needs_confirmation
from workers.store.keys import all_index_keys, member_run_key, parse_run_member
from workers.store.records import RunField
from workers.store.sweep_scripts import SWEEP_PAGE, RunSweep, SweepScripts

__all__ = ["PythonJudgeScripts"]

READ_RUNS = """
local now, fresh_after = tonumber(ARGV[1]), tonumber(ARGV[2])
local key_head, page = ARGV[3] .. ':{', tonumber(ARGV[4])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', ARGV[5], page)
local quiet = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', fresh_after, 'LIMIT', ARGV[6], page)
local rows, n = {}, 0
for i = 1, #quiet do
  local f = redis.call('HMGET', key_head .. quiet[i] .. '}:run', 'status', 'progress_ms', 'open_n', 'class',
                       'claimed_n')
  for j = 1, 5 do rows[n + j] = f[j] or '' end
  n = n + 5
end
return {due, quiet, rows}
"""

LEAN = os.environ.get("BENCH_LEAN") == "1"
_MOVING = ("active", "long_running")
_HAND_BACK = None  # what a classifier returns for a run the caller must judge from its whole record

Summary = list[str]  # status, progress_ms, open_n, class, claimed_n


def _by_judge(row: Summary, now_ms: int, policy: WatchdogPolicy) -> str | None:
    """The class ``judge`` gives a running run's summary, or None when it needs the caller."""
    status, progress, open_n, klass, claimed = row
    view = RunView(
        session_key="",
        run_id="",
        status=status,
        started_ms=0,
        deadline_ms=0,  # not in the deadline range: the run is not past it
        progress_ms=int(progress),
        previous_class=klass,
        open_calls=int(open_n or 0),
        claimed_calls=int(claimed or 0),
    )
    verdict = judge(view, now_ms=now_ms, policy=policy)
    if needs_confirmation(verdict) or verdict.klass is None:
        return _HAND_BACK
    return verdict.klass.value


def _lean(row: Summary, now_ms: int, policy: WatchdogPolicy) -> str | None:
    """``_by_judge`` from the plain values, without a ``RunView`` or a ``RunVerdict``."""
    _, progress, open_n, klass, claimed = row
    if int(progress) > now_ms - policy.stalled_after_ms:
        return "long_running" if open_n not in ("", "0") else "active"
    name = "stalled" if claimed not in ("", "0") else "stuck"
    if klass != name or (name == "stuck" and policy.auto_recover):
        return _HAND_BACK
    return name


_CLASSIFY = _lean if LEAN else _by_judge


class PythonJudgeScripts(SweepScripts):
    """:class:`SweepScripts` whose run phase reads in Redis and decides in Python."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read = self.client.register_script(READ_RUNS)

    def runs(self, *, now_ms: int, stalled_after_ms: int, auto_recover: bool, limit: int) -> RunSweep:
        """The script path's contract, decided here."""
        prefix = self.ledger.prefix
        policy = WatchdogPolicy(stalled_after_ms, auto_recover)
        buckets = all_index_keys(prefix)
        common = [now_ms, now_ms - stalled_after_ms, prefix, SWEEP_PAGE]
        todo = {n: (0, 0) for n in range(len(buckets))}
        read = dict.fromkeys(todo, 0)
        page = _Page(prefix, now_ms, policy)
        while todo:
            calls = [
                ([buckets[n].by_deadline, buckets[n].by_progress], [*common, *skip])
                for n, skip in todo.items()
            ]
            replies = self._evaluate(self._read, calls)
            page.writes = self.client.pipeline(transaction=False)
            following: dict[int, tuple[int, int]] = {}
            for (n, (skip_due, skip_quiet)), (due, quiet, rows) in zip(todo.items(), replies, strict=True):
                moved = page.decide(due, quiet, rows)
                if moved:
                    page.writes.zadd(buckets[n].by_progress, moved, xx=True, gt=True)
                read[n] += max(len(due), len(quiet))
                if SWEEP_PAGE in (len(due), len(quiet)) and read[n] < limit:
                    following[n] = (skip_due + len(due), skip_quiet + len(quiet) - len(moved))
            page.writes.execute()
            todo = following
        return RunSweep(page.settled, [parse_run_member(str(m)) for m in dict.fromkeys(page.rest)])


class _Page:
    """Judges pages of runs, counting the settled ones and queueing their writes."""

    def __init__(self, prefix: str, now_ms: int, policy: WatchdogPolicy) -> None:
        self.prefix, self.now_ms, self.policy = prefix, now_ms, policy
        self.settled: dict[str, int] = {}
        self.rest: list[str] = []
        self.writes: Any = None

    def decide(self, due: list[str], quiet: list[str], rows: list[str]) -> dict[str, int]:
        """Judge one page's quiet runs; queue their class writes; returns the members to move forward."""
        self.rest.extend(due)
        past = set(due)
        moved: dict[str, int] = {}
        for i, member in enumerate(quiet):
            row = rows[5 * i : 5 * i + 5]
            if member in past:
                continue
            name = _CLASSIFY(row, self.now_ms, self.policy) if row[0] == "running" and row[1] else _HAND_BACK
            if name is _HAND_BACK:
                self.rest.append(member)
                continue
            self.settled[name] = self.settled.get(name, 0) + 1
            if row[3] != name:
                self.writes.hset(member_run_key(self.prefix, member), RunField.CLASS, name)
            if name in _MOVING:
                moved[member] = int(row[1])
        return moved
