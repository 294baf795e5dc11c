"""``unstuck demo --json``: every call answered once, each scenario's reason, nothing left running."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from typing import Any

import pytest

from tests.e2e.conftest import alive, clean_env, pids_matching
from tests.harness import REPO, UNSTUCK

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def demo_run() -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    done = subprocess.run(
        [UNSTUCK, "demo", "--json"],
        env=clean_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"demo printed no JSON (exit {done.returncode}):\n{done.stdout}\n{done.stderr[-3000:]}")
    return done, report


@pytest.mark.timeout(120)
def test_demo_keeps_the_invariant_and_exits_zero(demo_run):
    # Given / When
    done, report = demo_run
    # Then
    invariant = report["invariant"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert invariant["holds"] is True
    assert invariant["missing"] == 0
    assert invariant["duplicates"] == 0
    assert invariant["calls"] == invariant["results"] == len(report["calls"])
    assert (
        invariant["line"]
        == f"{invariant['calls']} calls → {invariant['calls']} results, 0 missing, 0 duplicates"
    )


@pytest.mark.timeout(120)
def test_demo_shows_every_failure_reason(demo_run):
    # Given
    _, report = demo_run
    # When
    reasons = Counter(call["reason"] for call in report["calls"])
    by_scenario = {
        call["scenario"]: call for call in report["calls"] if call["scenario"] in ("R2", "R3", "R4")
    }
    # Then
    assert reasons["crashed"] == 2
    assert reasons["timeout_hard"] == 1
    assert reasons["worker_lost"] == 1
    assert reasons["invalid_arguments"] == 1
    assert reasons["unknown_tool"] == 1
    assert by_scenario["R3"]["via"] == "collect"
    assert by_scenario["R3"]["outcome"] == "ok"
    assert by_scenario["R3"]["text"].startswith("report ready")
    assert all(call["as_expected"] for call in report["calls"])


@pytest.mark.timeout(120)
def test_demo_answers_on_time(demo_run):
    # Given
    _, report = demo_run
    # Then
    late = [c for c in report["calls"] if c["on_time"] is False]
    assert late == []
    worker_lost = next(c for c in report["calls"] if c["reason"] == "worker_lost")
    assert worker_lost["latency_s"] <= 3.0 + 1.5  # lease TTL of the demo plus one check interval and slack
    assert report["runtime_s"] < 60


@pytest.mark.timeout(120)
def test_demo_leaves_no_process_behind(demo_run):
    # Given
    _, report = demo_run
    processes = report["processes"]
    port = processes["redis_url"].rsplit(":", 1)[1].split("/")[0]
    # Then
    own_pids = [processes["redis_pid"], processes["worker_pid"], processes["beat_pid"]]
    own_pids += processes["retired_worker_pids"]
    assert len(own_pids) == 4
    assert [pid for pid in own_pids if alive(pid)] == []
    assert pids_matching(processes["node_name"].split("@")[0] + "@") == []  # workers and pool children
    assert pids_matching(f"127.0.0.1:{port}") == []  # the embedded redis-server
    assert pids_matching(processes["logs"]) == []  # beat (its schedule file lives there)
