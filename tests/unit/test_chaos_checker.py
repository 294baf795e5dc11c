"""The failover soak's checker: duplicate executions from its own file, time to the first answer."""

from __future__ import annotations

from pathlib import Path
from random import Random

from bench.chaos_failover import (
    Episode,
    HandedBatch,
    History,
    duplicate_executions,
    episode_times,
    first_answers_ms,
    sentinel_kinds,
)
from bench.chaos_faults import SweepPulse, unexpected_task_errors
from workers import ToolResult
from workers.core.models import TextBlock
from workers.store.watchdog_liveness import SweepRecord


def _execution(call: str, attempt: int, execution: str, *, idempotent: bool = False) -> dict[str, object]:
    return {
        "session": "s",
        "run": "r0",
        "call": call,
        "attempt": attempt,
        "tool": "echo",
        "idempotent": idempotent,
        "execution": execution,
    }


def test_a_second_execution_of_a_call_is_a_duplicate_and_the_tool_s_own_retries_are_not() -> None:
    executions = [
        _execution("c0", 1, "10:1"),
        _execution("c0", 1, "10:1"),  # the tool's retry inside one execution
        _execution("c1", 1, "10:2"),
        _execution("c1", 2, "11:7"),  # a non-idempotent tool claimed again, run by another process
        _execution("c2", 1, "10:3", idempotent=True),
        _execution("c2", 2, "11:8", idempotent=True),  # an idempotent re-run under a new attempt
        _execution("c3", 1, "10:4", idempotent=True),
        _execution("c3", 1, "11:9", idempotent=True),  # the same claim run twice
    ]
    count, reruns, examples = duplicate_executions(executions)
    assert (count, reruns) == (2, 1)
    assert examples == [
        "s/r0/c1 (echo) ran 2 times, attempts ['1', '2']",
        "s/r0/c3 (echo) ran 2 times, attempts ['1', '1']",
    ]


def _batch(submitted_ms: int, returned_ms: int, reason: str | None) -> HandedBatch:
    details = {} if reason is None else {"synthetic": True, "reason": reason}
    result = ToolResult(
        tool_call_id="c", tool_name="echo", content=(TextBlock(text="t"),), is_error=False, details=details
    )
    return HandedBatch("s", "r0", submitted_ms, returned_ms, [result])


def test_first_answer_counts_only_real_results_of_calls_sent_after_the_fault() -> None:
    episodes = [
        Episode("primary SIGKILL", 1000),
        Episode("replica SIGKILL", 1500),
        Episode("primary SIGSTOP", 9000),
    ]
    batches = [
        _batch(900, 1200, None),  # sent before the fault
        _batch(1100, 2500, "worker_lost"),  # synthetic
        _batch(1200, 3400, None),
        _batch(1300, 3100, None),
    ]
    assert first_answers_ms(episodes, batches) == [2100, None]


def test_the_short_run_gets_the_measurement_s_two_primary_faults_first() -> None:
    assert episode_times(45) == [6.0, 24.0]
    assert sentinel_kinds(2, Random(1)) == ["primary SIGKILL", "primary SIGSTOP"]
    # Third: a returning primary failed over again before it resyncs (issue 42).
    assert sentinel_kinds(3, Random(1))[2] == "primary SIGKILL, then SIGSTOP"
    assert set(sentinel_kinds(5, Random(1))) == {
        "primary SIGKILL",
        "primary SIGSTOP",
        "primary SIGKILL, then SIGSTOP",
        "replica SIGKILL",
        "sentinel SIGKILL",
    }


def test_history_reads_back_what_the_agents_were_handed(tmp_path: Path) -> None:
    history = History(tmp_path)
    result = ToolResult(
        tool_call_id="c0", tool_name="echo", content=(TextBlock(text="hello"),), is_error=False
    )
    history.handed("s", "r0", 5, [result])
    [batch] = history.batches()
    assert (batch.session, batch.run, batch.submitted_ms, batch.results) == ("s", "r0", 5, [result])


def _pulse(*sweeps: tuple[int, int, int, int]) -> SweepPulse:
    """A pulse that saw these records: (last sweep, gap before it, worst gap, count)."""
    pulse = SweepPulse(ledger=None, started_ms=0)  # type: ignore[arg-type]  # only records are read
    for last, gap, worst, count in sweeps:
        pulse.note(SweepRecord(last_sweep_ms=last, last_gap_ms=gap, max_gap_ms=worst, sweeps=count))
    return pulse


def test_a_sweep_gap_across_an_outage_counts_from_its_end_plus_the_reconnect_allowance() -> None:
    # Given sweeps every second, then none from an outage (10.0-11.0 s) until 16.5 s
    pulse = _pulse(*[(t, 1000, 1000, t // 1000) for t in range(1000, 10_001, 1000)], (16_500, 6500, 6500, 11))
    pulse.outage(10_000, 11_000)
    # When the watchdog may take 2 s to reconnect
    worst, where = pulse.worst_gap(reconnect_ms=2000)
    # Then the 6.5 s gap counts from 13.0 s: the watchdog is blamed for 3.5 s, and told where
    assert worst == 3500
    assert where == "sweeps at +10000 and +16500 ms, after an outage +10000..+11000 ms"


def test_a_sweep_gap_away_from_any_outage_counts_whole() -> None:
    pulse = _pulse((1000, 1000, 1000, 1), (3500, 2500, 2500, 2), (4500, 1000, 2500, 3))
    pulse.outage(20_000, 21_000)
    assert pulse.worst_gap(reconnect_ms=2000) == (2500, "sweeps at +1000 and +3500 ms")


def test_sweeps_the_pulse_saw_late_keep_their_own_gaps() -> None:
    # Given sweeps each 1 s apart, the pulse seeing only every third (it was held up)
    pulse = _pulse((1000, 1000, 1000, 1), (4000, 1000, 1000, 4), (7000, 1000, 1000, 7))
    # Then no 3 s gap is made up, and the sweeps it missed are counted
    assert pulse.worst_gap(reconnect_ms=2000)[0] == 1000
    assert pulse.missed == 4


def test_a_gap_among_missed_sweeps_counts_from_the_watchdogs_worst() -> None:
    # Given the watchdog's worst gap grew to 2.6 s among sweeps the pulse did not see
    pulse = _pulse((1000, 1000, 1000, 1), (7000, 1000, 2600, 4))
    # Then that gap is counted, placed as late as it can have ended
    assert pulse.worst_gap(reconnect_ms=2000) == (2600, "sweeps at +3400 and +6000 ms")


def test_only_errors_no_task_should_raise_are_counted_from_the_workers_logs() -> None:
    # Lines as Celery logs them (the soak's worker and watchdog logs), from chaos seed 567986103
    worker = "\n".join(
        [
            "[2026-12-02 15:31:20,834: ERROR/ForkPoolWorker-17] Task sleepy [chaos-6/r0][chaos-6/r0/c175#0] "
            "raised unexpected: SoftTimeLimitExceeded()",
            "[2026-12-02 15:31:20,865: ERROR/ForkPoolWorker-17] Task echo [chaos-3/r0][chaos-3/r0/c177#0] "
            "raised unexpected: TypeError(\"'int' object is not subscriptable\")",
            "[2026-12-02 15:31:21,205: ERROR/ForkPoolWorker-17] Task sleepy [chaos-4/r0][chaos-4/r0/c169#0] "
            'raised unexpected: TypeError("int() argument must be a string")',
            "[2026-12-02 15:31:17,410: INFO/ForkPoolWorker-16] Task boom [chaos-3/r0][chaos-3/r0/c172#0] "
            "raised expected: ToolFailed(\"tool_error: Tool 'boom' failed\")",
        ]
    )
    watchdog = (
        "[2026-12-02 15:31:22,000: ERROR/ForkPoolWorker-1] Task unstuck.watchdog.sweep[48f1] "
        "raised unexpected: AttributeError('x')"
    )
    assert unexpected_task_errors([worker, watchdog]) == {"TypeError": 2, "AttributeError": 1}
    assert unexpected_task_errors([worker.splitlines()[0]]) == {}
    # Redis gone or refusing under the soak's faults: expected, as the soft limit is
    outage = "[t: ERROR/ForkPoolWorker-2] Task echo [s/r0][s/r0/c1#0] raised unexpected: ReadOnlyRedis('x')"
    assert unexpected_task_errors([outage]) == {}
