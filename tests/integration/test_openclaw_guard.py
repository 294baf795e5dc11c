"""OpenClaw's own calls through the guard the HTTP door runs: ledger records, loop verdicts, sweep."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.harness import UNSTUCK, wait_until
from workers.core.openclaw_calls import OpenClawCallState
from workers.gateway.openclaw_guard import OpenClawGuard
from workers.runtime import open_ledger
from workers.settings import Settings
from workers.store.openclaw_calls import tombstone_count
from workers.watchdog.openclaw_rpc import GatewayRpc
from workers.watchdog.openclaw_sweep import OpenClawSweep, marked_processes

pytestmark = pytest.mark.timeout(60)

EXEC = {"command": "sleep 600", "timeoutSeconds": 0}


@pytest.fixture
def guard(settings: Settings) -> OpenClawGuard:
    tuned = settings.model_copy(
        update={
            "openclaw": settings.openclaw.model_copy(update={"budgets_s": {"exec": 5.0, "*": 120.0}}),
            "tools": settings.tools.model_copy(update={"loop_detection": {"enabled": True}}),
        }
    )
    return OpenClawGuard(tuned, open_ledger(tuned))


def test_a_call_is_recorded_with_its_budget_and_ends_once(guard: OpenClawGuard) -> None:
    answer = guard.start("s", "r", "main", "exec", "c1", EXEC, now_ms=1_000)
    assert answer["block"] is False
    assert answer["deadline_ms"] == 6_000
    assert [c.call_id for c in guard.calls.due(6_000)] == ["c1"]
    assert guard.calls.due(5_999) == []
    assert guard.end("s", "c1", is_error=False, text="ok", now_ms=2_000)["ended"] is True
    assert guard.end("s", "c1", is_error=False, text="ok", now_ms=2_500)["ended"] is False
    call = guard.calls.get("s", "c1")
    assert call is not None
    assert call.state is OpenClawCallState.DONE
    assert call.ended_ms == 2_000
    assert guard.calls.due(10_000) == []


def test_the_same_exec_repeated_is_blocked_with_the_detectors_message(guard: OpenClawGuard) -> None:
    verdicts = []
    for i in range(30):
        # The plugin's marker differs per call; the detector must not see it.
        params = {**EXEC, "command": "ls", "env": {"UNSTUCK_CALL_ID": f"c{i}"}}
        answer = guard.start("s", "r", "main", "exec", f"c{i}", params, now_ms=1_000 + i)
        verdicts.append(answer)
        if answer["block"]:
            break
        guard.end("s", f"c{i}", is_error=False, text="same output", now_ms=1_000 + i)
    assert verdicts[-1]["block"] is True, "30 identical exec calls were never blocked"
    assert "ls" in verdicts[-1]["message"] or "exec" in verdicts[-1]["message"]
    blocked = guard.calls.get("s", f"c{len(verdicts) - 1}")
    assert blocked is not None
    assert blocked.state is OpenClawCallState.BLOCKED


def test_the_sweep_kills_an_overdue_exec_tree_by_its_marker(guard: OpenClawGuard, settings: Settings) -> None:
    call_id = f"call-{uuid.uuid4().hex}"
    env = {"UNSTUCK_CALL_ID": call_id, "PATH": "/usr/bin:/bin"}
    # A shell with a child, as OpenClaw's exec runs it.
    shell = subprocess.Popen(
        ["/bin/sh", "-c", f"{sys.executable} -c 'import time; time.sleep(600)'; true"], env=env
    )
    try:
        wait_until(lambda: len(marked_processes(call_id)) >= 2, timeout_s=10, what="the marked tree")
        start_ms = int(time.time() * 1000)
        guard.start("s2", "r", "main", "exec", call_id, EXEC, now_ms=start_ms)
        alerts: list[dict[str, object]] = []
        sweep = OpenClawSweep(guard.calls, settings, alert=alerts.append)
        assert sweep.sweep(start_ms + 4_000).killed == []  # inside its budget
        report = sweep.sweep(start_ms + 5_000)
        assert report.killed == [call_id]
        assert shell.wait(timeout=10) != 0
        wait_until(lambda: not marked_processes(call_id), timeout_s=10, what="the tree gone")
        assert [a["kind"] for a in alerts] == ["openclaw_call_killed"]
        call = guard.calls.get("s2", call_id)
        assert call is not None
        assert call.state is OpenClawCallState.KILLED
        # The plugin's own end, after the kill, does not overwrite it: one end per call.
        assert (
            guard.end("s2", call_id, is_error=True, text="killed", now_ms=start_ms + 6_000)["ended"] is False
        )
    finally:
        for proc in marked_processes(call_id):
            proc.kill()
        if shell.poll() is None:
            shell.kill()
        shell.wait()


def test_an_overdue_call_of_another_tool_is_alerted_once(guard: OpenClawGuard, settings: Settings) -> None:
    guard.start("s3", "r", "main", "web_fetch", "w1", {"url": "http://x"}, now_ms=0)
    alerts: list[dict[str, object]] = []
    sweep = OpenClawSweep(guard.calls, settings, alert=alerts.append, kill=lambda _c: 0)
    sweep.sweep(121_000)
    sweep.sweep(122_000)
    assert [a["kind"] for a in alerts if a["kind"] == "openclaw_call_overdue"] == ["openclaw_call_overdue"]


def test_a_silent_session_with_an_open_call_is_alerted(guard: OpenClawGuard, settings: Settings) -> None:
    guard.start("s4", "r", "main", "read", "r1", {}, now_ms=0)
    alerts: list[dict[str, object]] = []
    sweep = OpenClawSweep(guard.calls, settings, alert=alerts.append, kill=lambda _c: 0)
    stuck_ms = int(settings.openclaw.stuck_after_s * 1000)
    assert sweep.sweep(stuck_ms).stuck == []
    assert sweep.sweep(stuck_ms + 1_000).stuck == ["s4"]


def test_a_background_exec_stays_open_until_its_process_is_gone(
    guard: OpenClawGuard, settings: Settings
) -> None:
    guard.start("s5", "r", "main", "exec", "b1", EXEC, now_ms=0)
    # exec moved to the background after yieldMs: its tool call returned, its process runs on
    assert (
        guard.end("s5", "b1", is_error=False, text="Command still running", now_ms=1_000, running=True)[
            "ended"
        ]
        is False
    )
    running = guard.calls.get("s5", "b1")
    assert running is not None
    assert running.state is OpenClawCallState.OPEN
    alerts: list[dict[str, object]] = []
    sweep = OpenClawSweep(guard.calls, settings, alert=alerts.append, kill=lambda _c: 0)
    sweep.sweep(6_000)  # past the budget, no marked process left: it ended by itself
    gone = guard.calls.get("s5", "b1")
    assert gone is not None
    assert gone.state is OpenClawCallState.DONE
    assert alerts == []


def test_the_operator_sees_and_aborts_a_session(guard: OpenClawGuard, env: dict[str, str]) -> None:
    now = int(time.time() * 1000)
    guard.start("ops", "r", "main", "web_fetch", "w9", {"url": "http://x"}, now_ms=now)
    listed = subprocess.run(
        [UNSTUCK, "openclaw", "sessions", "--json"], env=env, capture_output=True, text=True
    )
    rows = json.loads(listed.stdout)
    assert [(r["session_key"], r["state"], [c["call_id"] for c in r["open_calls"]]) for r in rows] == [
        ("ops", "running", ["w9"])
    ]
    # Without openclaw.cli no run can be aborted from here: the operator is told which call is left
    aborted = subprocess.run([UNSTUCK, "openclaw", "abort", "ops"], env=env, capture_output=True, text=True)
    assert aborted.returncode == 1
    assert "w9" in aborted.stdout


class FakeOpenClaw:
    """An ``openclaw`` command that records each ``gateway call`` and answers from ``answers``."""

    def __init__(self, tmp_path: Path) -> None:
        self.record = tmp_path / "calls.jsonl"
        self.answers_file = tmp_path / "answers.json"
        self.answers({})
        self.cli = tmp_path / "openclaw"
        self.cli.write_text(
            f"#!{sys.executable}\n"
            "import json, pathlib, sys\n"
            f"with open({str(self.record)!r}, 'a') as f:\n"
            "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
            f"answers = json.loads(pathlib.Path({str(self.answers_file)!r}).read_text())\n"
            "print(json.dumps(answers.get(sys.argv[3], {'ok': True})))\n"
        )
        self.cli.chmod(0o755)

    def answers(self, by_method: dict[str, Any]) -> None:
        self.answers_file.write_text(json.dumps(by_method))

    def calls(self, method: str) -> list[dict[str, Any]]:
        """The params of each call of ``method``, in order."""
        if not self.record.exists():
            return []
        argvs = [json.loads(line) for line in self.record.read_text().splitlines()]
        return [json.loads(a[a.index("--params") + 1]) for a in argvs if a[:3] == ["gateway", "call", method]]


def _with_openclaw(settings: Settings, fake: FakeOpenClaw, **extra: Any) -> Settings:
    update = {"cli": str(fake.cli), "gateway_url": "ws://127.0.0.1:9", **extra}
    return settings.model_copy(update={"openclaw": settings.openclaw.model_copy(update=update)})


def _tombstoned(key: str, session_id: str) -> dict[str, Any]:
    row = {"key": key, "sessionId": session_id, "status": "failed", "restartRecoveryStatus": "tombstoned"}
    return {"sessions": [row, {"key": "agent:main:explicit:fine", "sessionId": "f"}], "hasMore": False}


def test_a_tombstoned_session_is_alerted_once_across_watchdogs(
    guard: OpenClawGuard, settings: Settings, tmp_path: Path
) -> None:
    fake = FakeOpenClaw(tmp_path)
    fake.answers({"sessions.list": _tombstoned("agent:main:explicit:t1", "t1")})
    tuned = _with_openclaw(settings, fake, tombstone_scan_interval_s=60)
    alerts: list[dict[str, Any]] = []
    first = OpenClawSweep(guard.calls, tuned, alert=alerts.append, kill=lambda _c: 0)
    assert first.sweep(1_000).tombstoned == ["agent:main:explicit:t1"]
    assert first.sweep(2_000).tombstoned == []  # within the interval: sessions.list not read again
    assert len(fake.calls("sessions.list")) == 1
    assert first.sweep(62_000).tombstoned == []  # read again: known already
    restarted = OpenClawSweep(guard.calls, tuned, alert=alerts.append, kill=lambda _c: 0)
    assert restarted.sweep(63_000).tombstoned == []  # another watchdog, the same tombstone
    assert [a["kind"] for a in alerts] == ["openclaw_session_tombstoned"]
    assert alerts[0]["session_key"] == "agent:main:explicit:t1"
    assert "/reset" in str(alerts[0]["note"])
    assert fake.calls("send") == []  # no openclaw.alert_target: no channel message


def test_a_tombstone_reset_and_tombstoned_again_is_alerted_again(
    guard: OpenClawGuard, settings: Settings, tmp_path: Path
) -> None:
    fake = FakeOpenClaw(tmp_path)
    tuned = _with_openclaw(settings, fake, tombstone_scan_interval_s=1)
    alerts: list[dict[str, Any]] = []
    sweep = OpenClawSweep(guard.calls, tuned, alert=alerts.append, kill=lambda _c: 0)
    ledger = open_ledger(settings)
    before = tombstone_count(ledger.client, ledger.prefix)  # other tests' tombstones share the store
    fake.answers({"sessions.list": _tombstoned("agent:main:explicit:t2", "t2")})
    sweep.sweep(1_000)
    fake.answers({"sessions.list": {"sessions": [], "hasMore": True}})  # a partial page forgets nothing
    sweep.sweep(3_000)
    fake.answers({"sessions.list": _tombstoned("agent:main:explicit:t2", "t2")})
    sweep.sweep(5_000)
    assert len(alerts) == 1
    assert tombstone_count(ledger.client, ledger.prefix) == before + 1  # the metric
    fake.answers({"sessions.list": {"sessions": [], "hasMore": False}})  # reset: no longer tombstoned
    sweep.sweep(7_000)
    assert tombstone_count(ledger.client, ledger.prefix) == before
    fake.answers({"sessions.list": _tombstoned("agent:main:explicit:t2", "t2")})
    sweep.sweep(9_000)
    assert [a["kind"] for a in alerts] == ["openclaw_session_tombstoned"] * 2


def test_stuck_and_tombstoned_sessions_go_to_the_alert_channel(
    guard: OpenClawGuard, settings: Settings, tmp_path: Path
) -> None:
    fake = FakeOpenClaw(tmp_path)
    fake.answers({"sessions.list": _tombstoned("agent:main:explicit:t3", "t3")})
    tuned = _with_openclaw(settings, fake, alert_target="channel:C123", alert_channel="slack")
    guard.calls.model_call("s6", "r", started=True, now_ms=0)  # a model stream gone silent
    sweep = OpenClawSweep(guard.calls, tuned, alert=lambda _a: None, kill=lambda _c: 0)
    stuck_ms = int(tuned.openclaw.stuck_after_s * 1000)
    sweep.sweep(stuck_ms + 1_000)
    sweep.sweep(stuck_ms + 2_000)  # alerted already: not sent again
    sent = fake.calls("send")
    assert [(p["to"], p["channel"]) for p in sent] == [("channel:C123", "slack")] * 2
    assert "s6" in sent[0]["message"]
    assert "no activity" in sent[0]["message"]
    assert "agent:main:explicit:t3" in sent[1]["message"]
    assert "/new" in sent[1]["message"]
    assert len({p["idempotencyKey"] for p in sent}) == 2
    argv = json.loads(fake.record.read_text().splitlines()[-1])
    assert argv[:3] == ["gateway", "call", "send"]
    assert argv[argv.index("--url") + 1] == "ws://127.0.0.1:9"


class AbortRacingRpc(GatewayRpc):
    """A gateway whose abort ends the run at once.

    OpenClaw's report of the end reaches unstuck (the plugin's after_tool_call) before the RPC
    returns, as it does with OpenClaw itself.
    """

    def __init__(self, settings: Settings, guard: OpenClawGuard) -> None:
        super().__init__(settings)
        self.guard = guard
        self.told: list[tuple[str, str]] = []

    @property
    def configured(self) -> bool:
        return True

    def abort(self, session_key: str, run_id: str) -> bool:
        for call in self.guard.calls.open_calls():
            if call.session_key == session_key:
                self.guard.end(session_key, call.call_id, is_error=True, text="aborted", now_ms=121_500)
        return True

    def tell(self, session_key: str, message: str) -> bool:
        self.told.append((session_key, message))
        return True

    def sessions(self, limit: int = 500) -> dict[str, Any] | None:
        return None


def test_an_aborted_call_is_alerted_and_told_though_openclaw_reported_its_end_first(
    guard: OpenClawGuard, settings: Settings
) -> None:
    guard.start("s7", "r7", "main", "web_fetch", "w7", {"url": "http://x"}, now_ms=0)
    rpc = AbortRacingRpc(settings, guard)
    alerts: list[dict[str, Any]] = []
    sweep = OpenClawSweep(guard.calls, settings, alert=alerts.append, kill=lambda _c: 0, rpc=rpc)
    assert sweep.sweep(121_000).killed == ["w7"]
    sweep.sweep(122_000)
    assert [a["kind"] for a in alerts] == ["openclaw_call_aborted"]
    assert [session for session, _ in rpc.told] == ["s7"]
    assert "w7" in rpc.told[0][1]
