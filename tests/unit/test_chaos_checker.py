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
from bench.chaos_faults import SweepPulse
from workers import ToolResult
from workers.core.models import TextBlock


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
    assert set(sentinel_kinds(4, Random(1))) == {
        "primary SIGKILL",
        "primary SIGSTOP",
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


def test_a_sweep_gap_across_an_outage_counts_from_its_end_plus_the_reconnect_allowance() -> None:
    # Given sweeps every second, then none from an outage (10.0-11.0 s) until 16.5 s
    pulse = SweepPulse(ledger=None)  # type: ignore[arg-type]  # only the recorded sweeps are read
    pulse.sweeps_ms = [*range(0, 10_001, 1000), 16_500, 17_500]
    pulse.outage(10_000, 11_000)
    # When the watchdog may take 2 s to reconnect
    worst, where = pulse.worst_gap(reconnect_ms=2000)
    # Then the 6.5 s gap counts from 13.0 s: the watchdog is blamed for 3.5 s, and told where
    assert worst == 3500
    assert where == "sweeps at +10000 and +16500 ms, after an outage +10000..+11000 ms"


def test_a_sweep_gap_away_from_any_outage_counts_whole() -> None:
    pulse = SweepPulse(ledger=None)  # type: ignore[arg-type]
    pulse.sweeps_ms = [0, 1000, 3500, 4500]
    pulse.outage(20_000, 21_000)
    assert pulse.worst_gap(reconnect_ms=2000) == (2500, "sweeps at +1000 and +3500 ms")
