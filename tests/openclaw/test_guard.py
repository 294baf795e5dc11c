"""OpenClaw's own tools guarded by unstuck's plugin (integrations/openclaw), with OpenClaw itself.

Each scenario is one or two headless ``openclaw agent --local`` turns (HOME a temp dir, the
plugin loaded from ``plugins.load.paths``) against the scripted model of
:mod:`tests.openclaw.mock_model`, with unstuck's HTTP door, watchdog and beat on a private
Redis. The checks read the transcript OpenClaw sends back to the model: every tool_call has
exactly one result; and no process of the scenario is left. Each scenario prints
``GUARD <scenario> PASS|FAIL <seconds until the model had a result>``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.harness import REPO, UNSTUCK, Proc, base_env, start_beat, start_watchdog, wait_until
from tests.openclaw.mock_model import MockModel, Step
from workers.local.embedded_redis import EmbeddedRedis, free_port

OPENCLAW = os.environ.get("UNSTUCK_OPENCLAW_BIN", "")
pytestmark = pytest.mark.skipif(not OPENCLAW, reason="make test-openclaw installs OpenClaw and sets its path")
NODE_BIN = os.environ.get("UNSTUCK_OPENCLAW_NODE_BIN", "")
PLUGIN = REPO / "integrations" / "openclaw"
EXEC_BUDGET_S = 5.0
WEB_BUDGET_S = 5.0
SWEEP_S = 1.0
OPENCLAW_REACTION_S = 6.0
STUCK_AFTER_S = 8.0
ALONE_TURN_S = 20
GATEWAY_TOKEN = "guard-gateway-token"
TURN_TIMEOUT_S = 120
MARKER = "UNSTUCK_CALL_ID"
LINES: list[str] = []


@dataclass
class Stack:
    """unstuck's door, watchdog and beat on a private Redis, and the alerts its webhook got.

    The watchdog reaches the gateway scenarios' OpenClaw gateway (``gateway_port``) through
    ``openclaw gateway call`` (``openclaw.cli``), with a HOME of its own.
    """

    door_url: str
    alerts: list[dict[str, Any]]
    gateway_port: int

    def alert(self, kind: str, session: str, timeout_s: float) -> dict[str, Any]:
        """The first alert of ``kind`` about a session whose key ends with ``session``."""
        found: list[dict[str, Any]] = []

        def seen() -> bool:
            found[:] = [
                a
                for a in self.alerts
                if a.get("kind") == kind and str(a.get("session_key")).endswith(session)
            ]
            return bool(found)

        wait_until(seen, timeout_s=timeout_s, interval_s=0.1, what=f"{kind} for {session}")
        return found[0]


class _Webhook(BaseHTTPRequestHandler):
    received: list[dict[str, Any]]

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.received.append({**json.loads(self.rfile.read(length) or b"{}"), "arrived_at": time.monotonic()})
        self.send_response(204)
        self.end_headers()


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    alerts: list[dict[str, Any]] = []
    handler = type("Webhook", (_Webhook,), {"received": alerts})
    webhook = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=webhook.serve_forever, daemon=True).start()
    redis = EmbeddedRedis().start()
    gateway_port = free_port()
    env = base_env(
        redis.url,
        HOME=tempfile.mkdtemp(prefix="unstuck-guard-watchdog-"),
        PATH=_path(),
        UNSTUCK_OPENCLAW__BUDGETS_S=json.dumps({"exec": EXEC_BUDGET_S, "web_fetch": WEB_BUDGET_S, "*": 120}),
        UNSTUCK_OPENCLAW__STUCK_AFTER_S=str(STUCK_AFTER_S),
        UNSTUCK_OPENCLAW__RECOVER="true",
        UNSTUCK_OPENCLAW__CLI=OPENCLAW,
        UNSTUCK_OPENCLAW__GATEWAY_URL=f"ws://127.0.0.1:{gateway_port}",
        UNSTUCK_OPENCLAW__GATEWAY_TOKEN=GATEWAY_TOKEN,
        UNSTUCK_WATCHDOG__INTERVAL_S=str(SWEEP_S),
        UNSTUCK_TOOLS__LOOP_DETECTION=json.dumps(
            {"enabled": True, "warningThreshold": 3, "criticalThreshold": 5}
        ),
        UNSTUCK_ALERTS__WEBHOOK_URL=f"http://127.0.0.1:{webhook.server_address[1]}/alerts",
    )
    port = free_port()
    door = Proc([UNSTUCK, "serve", "--port", str(port)], env, "serve-guard")
    watchdog = start_watchdog(env, name="guard")
    beat = start_beat(env)
    door.wait_for_log("Uvicorn running on", timeout_s=60)
    try:
        yield Stack(f"http://127.0.0.1:{port}", alerts, gateway_port)
    finally:
        for proc in (beat, watchdog, door):
            proc.kill()
        redis.close()
        webhook.shutdown()
        webhook.server_close()
    if LINES:
        print("\n" + "\n".join(LINES))


@dataclass
class Turn:
    returncode: int
    stderr: str
    model: MockModel

    def transcript(self) -> list[dict[str, Any]]:
        return self.model.requests[-1]["messages"] if self.model.requests else []


def _config(model: MockModel, door_url: str, *, fail_closed: bool = False) -> dict[str, Any]:
    plugin = {"url": door_url, "token": "", "failClosed": fail_closed, "timeoutMs": 1500}
    return {
        "models": model.models_config(),
        "agents": {"defaults": {"model": {"primary": "mock/mock"}}},
        "tools": {"toolSearch": False},
        "plugins": {
            "load": {"paths": [str(PLUGIN)]},
            "entries": {"unstuck": {"enabled": True, "config": plugin}},
        },
    }


def _home(config: dict[str, Any]) -> Path:
    home = Path(tempfile.mkdtemp(prefix="unstuck-guard-"))
    (home / ".openclaw").mkdir()
    (home / ".openclaw" / "openclaw.json").write_text(json.dumps(config, indent=1))
    return home


def _path() -> str:
    return f"{NODE_BIN}:{os.environ['PATH']}" if NODE_BIN else os.environ["PATH"]


def _argv(session: str, message: str, *, local: bool = True) -> list[str]:
    argv = [OPENCLAW, "agent", *(["--local"] if local else []), "--session-id", session, "-m", message]
    return [*argv, "--json", "--timeout", str(TURN_TIMEOUT_S)]


def _turn(
    home: Path,
    model: MockModel,
    session: str,
    message: str,
    *,
    local: bool = True,
    timeout_s: int = TURN_TIMEOUT_S,
) -> Turn:
    argv = _argv(session, message, local=local)
    argv[-1] = str(timeout_s)
    done = subprocess.run(
        argv,
        env={"PATH": _path(), "HOME": str(home), "NO_COLOR": "1"},
        cwd=home,
        capture_output=True,
        text=True,
        timeout=TURN_TIMEOUT_S + 120,
        check=False,
    )
    if done.returncode != 0:
        print(f"\nopenclaw exited {done.returncode}; stderr tail:\n{done.stderr[-3000:]}")
    return Turn(done.returncode, done.stderr, model)


class SilentModel(MockModel):
    """Its first answer never comes (a stream gone silent) until ``release`` or 90 s."""

    release: threading.Event

    def answer(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        if not self.requests:
            self.requests.append(request)
            self.received_at.append(time.monotonic())
            self.release.wait(90)
            return []
        return super().answer(request)


def _with_gateway(config: dict[str, Any], port: int) -> dict[str, Any]:
    auth = {"mode": "token", "token": GATEWAY_TOKEN}
    return {**config, "gateway": {"mode": "local", "port": port, "bind": "loopback", "auth": auth}}


def _start_gateway(home: Path, port: int) -> subprocess.Popen[bytes]:
    """``openclaw gateway run`` headless on loopback, once it listens."""
    argv = [OPENCLAW, "gateway", "run", "--port", str(port), "--bind", "loopback", "--auth", "token"]
    with (home / "gateway.log").open("ab") as log:  # the child keeps its own descriptor
        gateway = subprocess.Popen(
            [*argv, "--token", GATEWAY_TOKEN],
            env={"PATH": _path(), "HOME": str(home), "NO_COLOR": "1"},
            cwd=home,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def listening() -> bool:
        assert gateway.poll() is None, (home / "gateway.log").read_text()[-3000:]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return False
        return True

    wait_until(listening, timeout_s=120, interval_s=0.5, what="the gateway listening")
    return gateway


def _background_turn(home: Path, session: str, message: str) -> subprocess.Popen[str]:
    """A gateway turn (``openclaw agent`` without ``--local``) left running."""
    return subprocess.Popen(
        _argv(session, message, local=False),
        env={"PATH": _path(), "HOME": str(home), "NO_COLOR": "1"},
        cwd=home,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _results(transcript: list[dict[str, Any]]) -> dict[str, list[str]]:
    """tool_call id -> the texts of its results in the transcript (in call order)."""
    results: dict[str, list[str]] = {}
    for message in transcript:
        for call in message.get("tool_calls") or [] if message.get("role") == "assistant" else []:
            results.setdefault(call["id"], [])
    for message in transcript:
        if message.get("role") == "tool" and message.get("tool_call_id") in results:
            content = message.get("content")
            parts = content if isinstance(content, list) else [{"text": str(content or "")}]
            results[message["tool_call_id"]].append("".join(str(p.get("text", "")) for p in parts))
    return results


def _answer_seconds(model: MockModel, step: int) -> float | None:
    """From the model's tool-calling turn ``step`` to OpenClaw's next request (its result)."""
    if step >= len(model.sent):
        return None
    later = [at for at in model.received_at if at > model.sent[step].at]
    return later[0] - model.sent[step].at if later else None


def _marked_leftovers() -> list[str]:
    """Processes still carrying the plugin's marker (an exec tree nobody ended)."""
    left = []
    for proc in psutil.process_iter():
        try:
            if MARKER in proc.environ():
                left.append(" ".join(proc.cmdline())[:100])
                proc.kill()
        except psutil.Error:
            continue
    return left


def _wall(monotonic_at: float) -> float:
    """The wall-clock time of a ``time.monotonic()`` reading (the ledger's clock is the wall's)."""
    return time.time() - (time.monotonic() - monotonic_at)


def _leftovers_of(home: Path) -> list[str]:
    """Processes OpenClaw started with ``home`` as HOME that still run (killed here)."""
    left = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("HOME") == str(home):
                left.append(" ".join(proc.cmdline())[:100])
                proc.kill()
    return left


def _report(scenario: str, ok: bool, seconds: float | None) -> None:
    shown = "-" if seconds is None else f"{seconds:.1f}"
    line = f"GUARD {scenario} {'PASS' if ok else 'FAIL'} {shown}"
    LINES.append(line)
    print("\n" + line)


def _one_each(results: dict[str, list[str]]) -> bool:
    return bool(results) and all(len(texts) == 1 for texts in results.values())


def test_exec_hang(stack: Stack) -> None:
    model = MockModel(plan=[[("exec", {"command": "sleep 600", "timeoutSeconds": 0})]]).start()
    home = _home(_config(model, stack.door_url))
    try:
        first = _turn(home, model, "hang", "Run the plan.")
        seconds = _answer_seconds(model, 0)
        results = _results(first.transcript())
        asked_before = len(model.requests)
        second = _turn(home, model, "hang", "Are you still there?")
        answered = second.returncode == 0 and len(model.requests) > asked_before
    finally:
        model.stop()
    leftovers = _marked_leftovers()
    killed = [a for a in stack.alerts if a.get("kind") == "openclaw_call_killed"]
    # unstuck's part (the kill) within the budget plus one sweep, from the model's call (the
    # plugin hears of it a few hundred ms later); OpenClaw's own part after the kill (reaping,
    # its result, the next model request) measured 1.9-4 s on the shared 2-core machine.
    kill_s = killed[0]["ended_ms"] / 1000 - _wall(model.sent[0].at) if killed and model.sent else None
    in_time = (
        kill_s is not None
        and kill_s <= EXEC_BUDGET_S + SWEEP_S + 1
        and seconds is not None
        and seconds <= kill_s + OPENCLAW_REACTION_S
    )
    ok = _one_each(results) and in_time and answered and not leftovers and len(killed) == 1
    _report("exec_hang", ok, seconds)
    print(f"exec_hang: killed {kill_s}s after the call; result {results}")
    assert _one_each(results), results
    assert leftovers == []
    assert len(killed) == 1, stack.alerts
    assert answered, second.stderr[-2000:]
    assert in_time, seconds


def test_exec_hang_without_the_plugin(stack: Stack) -> None:
    """OpenClaw alone, for the README's comparison (no assertion on its timing: it is OpenClaw's)."""
    model = MockModel(plan=[[("exec", {"command": "sleep 600", "timeoutSeconds": 0})]]).start()
    config = _config(model, stack.door_url)
    del config["plugins"]
    home = _home(config)
    try:
        turn = _turn(home, model, "alone", "Run the plan.", timeout_s=ALONE_TURN_S)
    finally:
        model.stop()
    seconds = _answer_seconds(model, 0)
    results = _results(turn.transcript())
    left = _leftovers_of(home)
    first = next((texts[0] for texts in results.values() if texts), "no result")
    shown = "-" if seconds is None else f"{seconds:.1f}"
    LINES.append(f"ALONE exec_hang {shown} {first.splitlines()[0][:80]!r}")
    print(f"exec_hang alone: the model had a result after {seconds}; results {results}; left running {left}")
    assert _one_each(results), results


def test_exec_loop(stack: Stack) -> None:
    same: Step = [("exec", {"command": "echo same-output"})]
    model = MockModel(plan=[same] * 8).start()
    home = _home(_config(model, stack.door_url))
    try:
        turn = _turn(home, model, "loop", "Run the plan.")
    finally:
        model.stop()
    results = _results(turn.transcript())
    texts = [t[0] for t in results.values() if t]
    blocked = [i for i, text in enumerate(texts) if "CRITICAL" in text and "identical" in text]
    seconds = _answer_seconds(model, blocked[0]) if blocked else None
    ran = [text for text in texts[: blocked[0] if blocked else len(texts)] if "same-output" in text]
    leftovers = _marked_leftovers()
    ok = _one_each(results) and bool(blocked) and len(ran) == blocked[0] and not leftovers
    _report("exec_loop", ok, seconds)
    assert _one_each(results), results
    assert blocked, texts
    assert blocked[0] == 5, texts  # criticalThreshold 5: the sixth identical call is refused
    assert len(ran) == blocked[0], texts
    assert leftovers == []


def test_unstuck_down(stack: Stack) -> None:
    model = MockModel(plan=[[("exec", {"command": "echo tools-still-run"})]]).start()
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: unstuck stopped
    home = _home(_config(model, dead))
    try:
        turn = _turn(home, model, "down", "Run the plan.")
    finally:
        model.stop()
    results = _results(turn.transcript())
    seconds = _answer_seconds(model, 0)
    ran = [t for texts in results.values() for t in texts if "tools-still-run" in t]
    logged = turn.stderr.count("unreachable")
    leftovers = _marked_leftovers()
    ok = _one_each(results) and len(ran) == 1 and logged == 1 and not leftovers
    _report("unstuck_down", ok, seconds)
    assert _one_each(results), results
    assert len(ran) == 1, results
    assert logged == 1, turn.stderr[-2000:]
    assert leftovers == []


def test_silent_stream(stack: Stack) -> None:
    model = SilentModel(plan=[])
    model.release = threading.Event()
    model.start()
    home = _home(_with_gateway(_config(model, stack.door_url), stack.gateway_port))
    gateway = _start_gateway(home, stack.gateway_port)
    try:
        silent = _background_turn(home, "silent", "Say hi.")
        wait_until(lambda: bool(model.requests), timeout_s=120, interval_s=0.1, what="the model asked")
        stuck = stack.alert("openclaw_session_stuck", "silent", timeout_s=STUCK_AFTER_S + SWEEP_S + 30)
        alert_s = stuck["arrived_at"] - model.received_at[0]
        stack.alert("openclaw_session_recovered", "silent", timeout_s=60)
        recovered_s = time.monotonic() - model.received_at[0]
        silent.communicate(timeout=60)
        asked_before = len(model.requests)
        second = _turn(home, model, "silent", "Are you still there?", local=False)
        answered = second.returncode == 0 and len(model.requests) > asked_before
    finally:
        model.release.set()
        model.stop()
        _stop(gateway)
    results = _results(model.requests[-1]["messages"]) if model.requests else {}
    in_time = alert_s <= STUCK_AFTER_S + SWEEP_S + 2
    ok = in_time and answered and all(len(t) == 1 for t in results.values()) and not _marked_leftovers()
    _report("silent_stream", ok, recovered_s)
    print(f"silent_stream: alerted {alert_s:.1f}s after the silent request, recovered at {recovered_s:.1f}s")
    assert in_time, alert_s
    assert answered, second.stderr[-2000:]


def test_gateway_restart(stack: Stack) -> None:
    model = MockModel(plan=[[("exec", {"command": "sleep 600", "timeoutSeconds": 0})]]).start()
    home = _home(_with_gateway(_config(model, stack.door_url), stack.gateway_port))
    gateway = _start_gateway(home, stack.gateway_port)
    first: subprocess.Popen[str] | None = None
    try:
        first = _background_turn(home, "restart", "Run the plan.")
        wait_until(
            lambda: bool(model.sent) and _marked_count() > 0, timeout_s=120, interval_s=0.1, what="exec"
        )
        gateway.kill()  # SIGKILL the gateway alone, mid-exec: its exec child is orphaned
        gateway.wait(timeout=30)
        _stop(gateway)
        # The gateway's exec child dies with it or is killed at its budget: either way the call
        # leaves open in unstuck's ledger and no marked process is left.
        wait_until(
            lambda: _marked_count() == 0, timeout_s=EXEC_BUDGET_S + SWEEP_S + 30, what="exec tree gone"
        )
        wait_until(
            lambda: _open_calls(stack, "restart") == 0, timeout_s=EXEC_BUDGET_S + 30, what="call closed"
        )
        with contextlib.suppress(subprocess.TimeoutExpired):
            first.communicate(timeout=10)  # the client lost its gateway; nobody waits for it
        _stop(first)
        gateway = _start_gateway(home, stack.gateway_port)
        asked_before = len(model.requests)
        second = _turn(home, model, "restart", "Are you still there?", local=False)
        answered = second.returncode == 0 and len(model.requests) > asked_before
    finally:
        if first is not None:
            _stop(first)
        model.stop()
        _stop(gateway)
    results = _results(model.requests[-1]["messages"]) if model.requests else {}
    seconds = _answer_seconds(model, 0)
    ok = answered and _one_each(results) and not _marked_leftovers()
    _report("gateway_restart", ok, seconds)
    print(f"gateway_restart: first turn exited {first.returncode if first else None}; results {results}")
    assert answered, second.stderr[-2000:]
    assert _one_each(results), results


def _open_calls(stack: Stack, session: str) -> int:
    """Open calls unstuck holds for a session whose key ends with ``session``."""
    with urllib.request.urlopen(f"{stack.door_url}/v1/openclaw/sessions", timeout=10) as response:
        rows = json.loads(response.read())
    return sum(len(r["open_calls"]) for r in rows if str(r["session_key"]).endswith(session))


def _marked_count() -> int:
    count = 0
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            count += MARKER in proc.environ()
    return count


def test_unstuck_down_with_fail_closed_blocks_the_tools(stack: Stack) -> None:
    model = MockModel(plan=[[("exec", {"command": "echo must-not-run"})]]).start()
    dead = f"http://127.0.0.1:{free_port()}"
    home = _home(_config(model, dead, fail_closed=True))
    try:
        turn = _turn(home, model, "closed", "Run the plan.")
    finally:
        model.stop()
    results = _results(turn.transcript())
    texts = [t for texts in results.values() for t in texts]
    assert _one_each(results), results
    assert all("must-not-run" not in t for t in texts), texts  # the command never ran
    assert any("failClosed" in t for t in texts), texts


class _Unanswering:
    """A loopback HTTP server that accepts connections and never answers them (a hung fetch)."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.accepted.append(self._listener.accept()[0])

    def close(self) -> None:
        self._listener.close()
        for conn in self.accepted:
            conn.close()


def test_tool_abort(stack: Stack) -> None:
    """A non-exec tool past its budget is aborted through the gateway and the session told.

    ``sessions.abort`` with the call's ``runId``, then ``sessions.send``: the model goes on in the
    same session, and no call in what it is sent lacks its one result.
    """
    server = _Unanswering()
    url = f"http://127.0.0.1:{server.port}/hangs"
    model = MockModel(plan=[[("web_fetch", {"url": url})]]).start()
    config = _with_gateway(_config(model, stack.door_url), stack.gateway_port)
    # OpenClaw's own fetch timeout well past unstuck's budget; loopback allowed for the test's server.
    web = {"fetch": {"timeoutSeconds": 120, "ssrfPolicy": {"allowedHostnames": ["127.0.0.1"]}}}
    config["tools"] = {**config["tools"], "web": web}
    home = _home(config)
    gateway = _start_gateway(home, stack.gateway_port)
    turn: subprocess.Popen[str] | None = None
    told: list[dict[str, Any]] = []
    try:
        turn = _background_turn(home, "abort", "Run the plan.")
        aborted = stack.alert("openclaw_call_aborted", "abort", timeout_s=WEB_BUDGET_S + SWEEP_S + 120)
        note = str(aborted["note"])

        def the_note_arrived() -> bool:
            told[:] = [r for r in model.requests if note in json.dumps(r.get("messages"))]
            return bool(told)

        wait_until(the_note_arrived, timeout_s=90, interval_s=0.2, what="the note sent into the session")
        with contextlib.suppress(subprocess.TimeoutExpired):
            turn.communicate(timeout=30)
    except AssertionError:
        print(f"tool_abort: alerts {stack.alerts}; model sent {model.sent}; accepted {len(server.accepted)}")
        print((home / "gateway.log").read_text()[-4000:])
        raise
    finally:
        if turn is not None:
            _stop(turn)
        model.stop()
        _stop(gateway)
        server.close()
    transcript = told[0]["messages"]
    results = _results(transcript)
    # OpenClaw either keeps the aborted turn's call in the session and repairs its missing
    # result, or, seen once in CI (2026-12-06), sends the note with the turn's call left out:
    # either way no call in what the model is sent lacks its one result, and the note goes
    # on in the same session (its first message is there).
    paired = all(len(texts) == 1 for texts in results.values())
    same_session = "Run the plan." in json.dumps(transcript)
    seconds = _answer_seconds(model, 0)
    fetched = model.sent[0].calls[0][0] if model.sent else ""
    ended_s = aborted["ended_ms"] / 1000 - _wall(model.sent[0].at) if model.sent else None
    in_time = ended_s is not None and ended_s <= WEB_BUDGET_S + SWEEP_S + 2
    left = _leftovers_of(home)
    ok = paired and same_session and aborted["tool"] == "web_fetch" and in_time and not left
    _report("tool_abort", ok, seconds)
    roles = [m.get("role") for m in transcript]
    print(f"tool_abort: aborted {ended_s}s after the call ({fetched}); results {results}; left {left}")
    print(f"tool_abort: {len(told)} of {len(model.requests)} requests carried the note; the first: {roles}")
    assert aborted["tool"] == "web_fetch", aborted
    assert aborted["call_id"] == fetched, (aborted, fetched)
    assert paired, results
    assert same_session, transcript
    assert in_time, ended_s
    assert left == []
