"""OpenClaw's own tools guarded by unstuck's plugin (integrations/openclaw), with OpenClaw itself.

Each scenario is one or two headless ``openclaw agent --local`` turns (HOME a temp dir, the
plugin loaded from ``plugins.load.paths``) against the scripted model of
:mod:`tests.openclaw.mock_model`, with unstuck's HTTP door, watchdog and beat on a private
Redis. The checks read the transcript OpenClaw sends back to the model: every tool_call has
exactly one result; and no process of the scenario is left. Each scenario prints
``GUARD <scenario> PASS|FAIL <seconds until the model had a result>``.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.harness import REPO, UNSTUCK, Proc, base_env, start_beat, start_watchdog
from tests.openclaw.mock_model import MockModel, Step
from workers.local.embedded_redis import EmbeddedRedis, free_port

OPENCLAW = os.environ.get("UNSTUCK_OPENCLAW_BIN", "")
pytestmark = pytest.mark.skipif(not OPENCLAW, reason="make test-openclaw installs OpenClaw and sets its path")
NODE_BIN = os.environ.get("UNSTUCK_OPENCLAW_NODE_BIN", "")
PLUGIN = REPO / "integrations" / "openclaw"
EXEC_BUDGET_S = 5.0
SWEEP_S = 1.0
TURN_TIMEOUT_S = 120
MARKER = "UNSTUCK_CALL_ID"
LINES: list[str] = []


@dataclass
class Stack:
    """unstuck's door, watchdog and beat on a private Redis, and the alerts its webhook got."""

    door_url: str
    alerts: list[dict[str, Any]]


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
    env = base_env(
        redis.url,
        UNSTUCK_OPENCLAW__BUDGETS_S=json.dumps({"exec": EXEC_BUDGET_S, "*": 120}),
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
    yield Stack(f"http://127.0.0.1:{port}", alerts)
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
    entry = {
        "id": "mock",
        "name": "mock",
        "api": "openai-completions",
        "reasoning": False,
        "input": ["text"],
        "contextWindow": 128000,
        "maxTokens": 4000,
    }
    provider = {"baseUrl": model.base_url, "apiKey": "mock", "api": "openai-completions", "models": [entry]}
    plugin = {"url": door_url, "token": "", "failClosed": fail_closed, "timeoutMs": 1500}
    return {
        "models": {"mode": "merge", "providers": {"mock": provider}},
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


def _turn(home: Path, model: MockModel, session: str, message: str) -> Turn:
    path = f"{NODE_BIN}:{os.environ['PATH']}" if NODE_BIN else os.environ["PATH"]
    argv = [OPENCLAW, "agent", "--local", "--session-id", session, "-m", message, "--json"]
    argv += ["--timeout", str(TURN_TIMEOUT_S)]
    done = subprocess.run(
        argv,
        env={"PATH": path, "HOME": str(home), "NO_COLOR": "1"},
        cwd=home,
        capture_output=True,
        text=True,
        timeout=TURN_TIMEOUT_S + 120,
        check=False,
    )
    if done.returncode != 0:
        print(f"\nopenclaw exited {done.returncode}; stderr tail:\n{done.stderr[-3000:]}")
    return Turn(done.returncode, done.stderr, model)


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
    in_time = seconds is not None and seconds <= EXEC_BUDGET_S + SWEEP_S + 2
    ok = _one_each(results) and in_time and answered and not leftovers and len(killed) == 1
    _report("exec_hang", ok, seconds)
    print(f"exec_hang: results {results}; alerts {killed}")
    print(f"exec_hang: sent at {model.sent[0].at}; asked at {model.received_at}")
    assert _one_each(results), results
    assert leftovers == []
    assert len(killed) == 1, stack.alerts
    assert answered, second.stderr[-2000:]
    assert in_time, seconds


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
