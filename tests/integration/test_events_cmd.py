"""``unstuck events``: the cluster-wide events stream from any host, recent first, then followed."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from tests.harness import REPO, wait_until
from workers.cli.main import main
from workers.runtime import open_ledger
from workers.settings import Settings

pytestmark = pytest.mark.timeout(60)


def test_recent_events_are_printed_oldest_first_as_json(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given three events from different processes
    ledger = open_ledger(settings)
    for n in range(3):
        ledger.publish_event("synthetic", session_key="s1", call_id=f"c{n}", reason="worker_lost")
    # When the last two are asked for
    code = main(["events", "-n", "2", "--json"])
    # Then they come oldest first, with their time and fields
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["call_id"] for line in lines] == ["c1", "c2"]
    assert {line["event"] for line in lines} == {"synthetic"}
    assert all(line["at"].endswith("Z") for line in lines)


def test_follow_prints_events_as_they_arrive(settings: Settings, env: dict[str, str]) -> None:
    # Given `unstuck events --follow` running with nothing recent to show
    ledger = open_ledger(settings)
    ledger.publish_event("old", n=0)
    follower = subprocess.Popen(
        [sys.executable, "-m", "workers.cli.main", "events", "--follow", "-n", "0"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    out = follower.stdout
    assert out is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(out.readline, "")), daemon=True)
    reader.start()
    try:
        # When another process appends events (again until the follower, still starting, shows one)
        def shown() -> bool:
            ledger.publish_event("session.stuck", session_key="s9", run_id="r1")
            return any("session.stuck" in line for line in lines)

        wait_until(shown, timeout_s=20, interval_s=0.2, what="a followed event printed")
        # Then it is printed as it arrives, and the old one, from before the follow began, is not
        assert "session_key=s9" in next(line for line in lines if "session.stuck" in line)
        assert not any(" old " in line for line in lines)
    finally:
        follower.terminate()
        follower.wait(timeout=10)
        reader.join(5)
        out.close()


def test_a_negative_count_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["events", "-n", "-1"]) == 2
    assert "--lines" in capsys.readouterr().err
