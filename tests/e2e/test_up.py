"""``unstuck up``: SIGTERM leaves nothing running; start-up failures are one sentence and exit 2."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import alive, clean_env, pids_matching
from tests.harness import REPO, UNSTUCK, wait_until
from workers.local.embedded_redis import free_port

pytestmark = [pytest.mark.slow]


def _started_event(out_path: Path, process: subprocess.Popen[bytes]) -> dict[str, Any]:
    def started() -> bool:
        assert process.poll() is None, out_path.read_text()
        return '"event": "started"' in out_path.read_text()

    wait_until(started, timeout_s=60, interval_s=0.05, what="the started event of unstuck up")
    first = out_path.read_text().splitlines()[0]
    event: dict[str, Any] = json.loads(first)
    return event


def _pool_children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


@pytest.mark.timeout(90)
def test_sigterm_stops_redis_worker_watchdog_beat_and_the_api(tmp_path):
    # Given: unstuck up running with its embedded Redis and the HTTP API on a free port
    out_path = tmp_path / "up.out"
    state_file = tmp_path / "state.json"
    api_port = free_port()
    argv = [
        UNSTUCK,
        "up",
        "--log-format",
        "json",
        "--state-file",
        str(state_file),
        "--serve-port",
        str(api_port),
    ]
    with out_path.open("wb") as out:
        process = subprocess.Popen(argv, env=clean_env(), cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        event = _started_event(out_path, process)
        state = json.loads(state_file.read_text())
        pids = [event["redis_pid"], event["worker_pid"], event["watchdog_pid"], event["beat_pid"]]
        pids += _pool_children(event["worker_pid"])
        with urllib.request.urlopen(f"{event['api_url']}/healthz", timeout=10) as health:
            assert json.loads(health.read()) == {"ok": True}
        assert event["api_url"] == f"http://127.0.0.1:{api_port}"
        port = event["redis_url"].rsplit(":", 1)[1].split("/")[0]
        assert state["redis_url"] == event["redis_url"]
        assert all(alive(pid) for pid in pids)
        assert len(pids) >= 4  # at least one pool child
        # When
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=40)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # Then
    assert code == 0, out_path.read_text()
    assert [pid for pid in pids if alive(pid)] == []
    assert pids_matching(f"127.0.0.1:{port}") == []
    assert pids_matching(event["logs"]) == []
    assert not state_file.exists()
    assert '"event": "stopped"' in out_path.read_text()


def _failed_start(
    tmp_path: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    state = tmp_path / "state.json"
    argv = [UNSTUCK, "up", "--no-serve", "--state-file", str(state), *extra]
    return subprocess.run(argv, env=env or clean_env(), cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(60)
def test_taken_port_is_one_sentence_and_exit_2(tmp_path):
    # Given: something already listens on the port we ask for
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        # When
        done = _failed_start(tmp_path, "--redis-port", str(port))
    # Then
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert f"port {port} is already in use" in done.stderr
    assert "--redis-port" in done.stderr
    assert done.stdout == ""


@pytest.mark.timeout(60)
def test_unreachable_redis_url_is_one_sentence_and_exit_2(tmp_path):
    # Given: a Redis URL nobody listens on
    url = f"redis://127.0.0.1:{free_port()}/0"
    env = {**clean_env(), "UNSTUCK_REDIS__URL": url}
    # When
    done = _failed_start(tmp_path, env=env)
    # Then
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert f"cannot reach Redis at {url}" in done.stderr
    assert "UNSTUCK_REDIS__URL" in done.stderr


@pytest.mark.timeout(60)
def test_unimportable_tool_module_is_one_sentence_and_exit_2(tmp_path):
    # Given
    env = {**clean_env(), "UNSTUCK_TOOL_MODULES": "no_such_package.tools"}
    # When
    done = _failed_start(tmp_path, env=env)
    # Then
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "no_such_package.tools cannot be imported" in done.stderr
    assert "fix UNSTUCK_TOOL_MODULES" in done.stderr
