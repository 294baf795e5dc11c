"""OpenClaw itself drives unstuck's MCP door, and a plain MCP server for comparison.

Each run is one ``openclaw agent exec --json`` turn (HOME a temp dir) against the scripted
model of :mod:`tests.openclaw.mock_model`, which calls the scenarios one assistant turn each:
healthy, malformed, unknown, hung, slow (longer than the client's timeout), its late result,
a turn of parallel calls, crash, a call after the crash, and last a long call during which
OpenClaw is killed (cancelled: the client's stream closes). The checks read the transcript
OpenClaw sends back to the model: every tool_call has exactly one result, unstuck's (never
OpenClaw's own ``-32001`` timeout), the same text as the ledger's; and no process is left.

Most runs use a client timeout of 8 s (``requestTimeoutMs`` and ``mcp.client_timeout_s``);
one run keeps OpenClaw's default (60 s) with a 90 s tool. The figures table is printed at the
end (and written to ``$UNSTUCK_OPENCLAW_FIGURES`` when set).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.harness import REPO, UNSTUCK, Proc, base_env, start_worker, store_client, wait_until
from tests.openclaw.mock_model import LAST_CALL_ID, MockModel, Step
from workers.core.models import ToolResult
from workers.local.embedded_redis import EmbeddedRedis, free_port

OPENCLAW = os.environ.get("UNSTUCK_OPENCLAW_BIN", "")
pytestmark = pytest.mark.skipif(not OPENCLAW, reason="make test-openclaw installs OpenClaw and sets its path")
NODE_BIN = os.environ.get("UNSTUCK_OPENCLAW_NODE_BIN", "")
CLIENT_TIMEOUT_S = 8.0
DEFAULT_TIMEOUT_S = 60.0
EXEC_TIMEOUT_S = 400.0

SCENARIOS: list[tuple[str, Step]] = [
    ("healthy", [("echo", {"text": "hi", "times": 2})]),
    ("malformed", [("echo", {"text": 5, "bogus": True})]),
    ("unknown", [("ech0", {"text": "x"})]),
    ("hung", [("stubborn", {"seconds": 600})]),
    ("slow", [("slow", {"seconds": 10})]),
    ("late result", [("unstuck_result", {"call_id": LAST_CALL_ID})]),
    (
        "parallel",
        [
            ("echo", {"text": "a"}),
            ("stubborn", {"seconds": 600}),
            ("sleepy", {"seconds": 600}),
            ("echo", {"text": "b"}),
        ],
    ),
    ("crash", [("crash", {})]),
    ("after crash", [("echo", {"text": "after"})]),
    ("cancelled", [("hog", {"seconds": 120})]),
]
PLAIN_SCENARIOS = [(name, step) for name, step in SCENARIOS if name != "late result"]


@dataclass
class Figure:
    """One scenario of one run: how long until answered, by whom, results per call."""

    server: str
    transport: str
    tool_search: bool
    scenario: str
    seconds: float | None
    who: str
    results_per_call: str

    def row(self) -> str:
        seconds = "-" if self.seconds is None else f"{self.seconds:.1f}"
        search = "on" if self.tool_search else "off"
        return (
            f"| {self.server} | {self.transport} | {search} | {self.scenario} | {seconds} | {self.who} "
            f"| {self.results_per_call} |"
        )


FIGURES: list[Figure] = []


@dataclass
class Backbone:
    """The private Redis, a tool worker and unstuck's HTTP door (8 s client timeout)."""

    env: dict[str, str]
    redis_url: str
    door_url: str


def _door_env(env: dict[str, str], client_timeout_s: float | None) -> dict[str, str]:
    if client_timeout_s is None:
        return env
    return {**env, "UNSTUCK_MCP__CLIENT_TIMEOUT_S": str(client_timeout_s)}


def _start_door(env: dict[str, str], name: str) -> tuple[Proc, str]:
    port = free_port()
    door = Proc([UNSTUCK, "mcp", "--port", str(port)], env, name)
    door.wait_for_log("Streamable HTTP on", timeout_s=60)
    return door, f"http://127.0.0.1:{port}/mcp"


@pytest.fixture(scope="module")
def backbone() -> Iterator[Backbone]:
    redis = EmbeddedRedis().start()
    env = base_env(redis.url)
    worker = start_worker(env, concurrency=6, name="openclaw")
    door, url = _start_door(_door_env(env, CLIENT_TIMEOUT_S), "mcp-openclaw")
    yield Backbone(env, redis.url, url)
    door.stop()
    worker.stop()
    redis.close()


def _ledger_texts(redis_url: str) -> list[tuple[str, str, str]]:
    """(tool, reason, text) of every answered call in the ledger."""
    client = store_client(redis_url)
    out: list[tuple[str, str, str]] = []
    for key in client.scan_iter(match="*:call:*", count=1000):
        raw = client.hget(key, "result")
        if raw:
            result = ToolResult.from_json(raw)
            out.append((result.tool_name, result.reason or "ok", _text(result)))
    client.close()
    return out


def _text(result: ToolResult) -> str:
    return "\n".join(block.text for block in result.content)


def _config(model: MockModel, name: str, server: dict[str, Any], tool_search: bool) -> dict[str, Any]:
    config: dict[str, Any] = {
        "models": model.models_config(),
        "agents": {"defaults": {"model": {"primary": "mock/mock"}}},
        "mcp": {"servers": {name: server}},
    }
    if not tool_search:
        config["tools"] = {"toolSearch": False}
    return config


def _stdio_unstuck(backbone: Backbone, client_timeout_s: float) -> dict[str, Any]:
    """Unstuck as OpenClaw starts it: everything as arguments (OpenClaw strips PYTHONPATH)."""
    limits = {k: v for k, v in backbone.env.items() if k.startswith(("UNSTUCK_LEASE__", "UNSTUCK_LIMITS__"))}
    return {
        "command": UNSTUCK,
        "args": [
            "mcp",
            "--stdio",
            "--path",
            str(REPO),
            "--tool-modules",
            "tests.misbehaving_tools",
            "--redis-url",
            backbone.redis_url,
        ],
        "env": {**limits, "UNSTUCK_MCP__CLIENT_TIMEOUT_S": str(client_timeout_s)},
    }


def _timeout_fields(timeout_s: float | None) -> dict[str, Any]:
    base: dict[str, Any] = {"supportsParallelToolCalls": True}
    return base if timeout_s is None else {**base, "requestTimeoutMs": int(timeout_s * 1000)}


@dataclass
class Turn:
    """What one ``openclaw agent exec`` did: the model's view, OpenClaw's verdict, leftovers."""

    model: MockModel
    started: float
    killed_at: float
    returncode: int | None
    envelope: dict[str, Any]
    leftovers: list[str]

    def transcript(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.model.requests[-1]["messages"] if self.model.requests else []
        return messages


def _openclaw_env(home: Path) -> dict[str, str]:
    path = f"{NODE_BIN}:{os.environ['PATH']}" if NODE_BIN else os.environ["PATH"]
    return {"PATH": path, "HOME": str(home), "NO_COLOR": "1"}


def _processes_under(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return [p for p in found if p.pid != os.getpid()]


def _run_openclaw(
    config: dict[str, Any],
    model: MockModel,
    home: Path,
    *,
    kill_when: Callable[[], bool] | None = None,
    marker: str = "",
) -> Turn:
    """One turn; with ``kill_when``, OpenClaw is killed once the last step is sent and it holds.

    ``home`` (in OpenClaw's command line) and ``marker`` (in a stdio server's) find what is
    left running afterwards; only such processes are reported and killed.
    """
    config_file = home / "openclaw.json5"
    config_file.write_text(json.dumps(config, indent=1))
    started = killed_at = time.monotonic()
    proc = subprocess.Popen(
        [OPENCLAW, "agent", "exec", "--config", str(config_file), "--json", "Run the plan."],
        env=_openclaw_env(home),
        cwd=home,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        if kill_when is not None:
            wait_until(
                lambda: (len(model.sent) == len(model.plan) and kill_when()) or proc.poll() is not None,
                timeout_s=EXEC_TIMEOUT_S,
                interval_s=0.1,
                what="the last call running",
            )
            # OpenClaw alone, as when its host stops it: it closes its MCP servers itself.
            killed_at = time.monotonic()
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=EXEC_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
    envelope: dict[str, Any] = {}
    if out.strip().startswith("{"):
        envelope = json.loads(out)
    if proc.returncode != 0 and kill_when is None:
        print(f"\nopenclaw exited {proc.returncode}; stderr tail:\n{err[-3000:]}")
    leftovers = _leftovers(*[m for m in (marker, str(home)) if m])
    return Turn(model, started, killed_at, proc.returncode, envelope, leftovers)


def _leftovers(*markers: str) -> list[str]:
    """Processes still running with a marker in their command line, 15 s after the turn."""
    deadline = time.monotonic() + 15
    while True:
        alive = [p for marker in markers for p in _processes_under(marker)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    names = []
    for proc in alive:
        try:
            names.append(" ".join(proc.cmdline())[:120])
            proc.kill()
        except psutil.Error:
            continue
    return names


def _results(transcript: list[dict[str, Any]]) -> dict[str, list[str]]:
    """tool_call id -> the texts of its results in the transcript."""
    results: dict[str, list[str]] = {}
    for message in transcript:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                results.setdefault(call["id"], [])
    for message in transcript:
        if message.get("role") == "tool" and message.get("tool_call_id") in results:
            content = message.get("content")
            text = (
                "".join(p.get("text", "") for p in content if isinstance(p, dict))
                if isinstance(content, list)
                else str(content or "")
            )
            results[message["tool_call_id"]].append(_unwrapped(text))
    return results


def _unwrapped(text: str) -> str:
    """The tool's own text of a result Tool Search wrapped (a notice around a JSON envelope)."""
    if "<<<EXTERNAL_UNTRUSTED_CONTENT" not in text or "\n---\n" not in text:
        return text
    body = text.split("\n---\n", 1)[1].rsplit("\n<<<END_EXTERNAL_UNTRUSTED_CONTENT", 1)[0]
    try:
        envelope = json.loads(body)
    except ValueError:
        return text
    result = envelope.get("result") if isinstance(envelope, dict) else None
    if not isinstance(result, dict):
        return text
    blocks = result.get("content", [])
    return "\n".join(str(block.get("text", "")) for block in blocks if isinstance(block, dict))


def _calling_turns(transcript: list[dict[str, Any]], tool_search: bool) -> list[list[str]]:
    """The tool_call ids of each scenario's turn (with Tool Search: the tool_call turns only)."""
    turns = [m for m in transcript if m.get("role") == "assistant" and m.get("tool_calls")]
    ids = [
        [c["id"] for c in m["tool_calls"] if not tool_search or c["function"]["name"] == "tool_call"]
        for m in turns
    ]
    return [turn for turn in ids if turn]


PLAIN_OUTPUTS = {"hihi", "a", "b", "after", "slow done", "slept", "woke up", "hog done"}


def _holds(text: str, answer: str) -> bool:
    """The model got exactly the ledger's answer (byte for byte, once unwrapped)."""
    return bool(answer) and text == answer


def _who(text: str, ledger: list[tuple[str, str, str]], server: str) -> str:
    if "-32001" in text or "Request timed out" in text:
        return "OpenClaw -32001"
    if server == "unstuck":
        reasons = [reason for _, reason, answer in ledger if _holds(text, answer)]
        return f"unstuck ({reasons[0]})" if reasons else "OpenClaw"
    return "plain server" if any(_holds(text, out) for out in PLAIN_OUTPUTS) else "OpenClaw"


def _a_moment_later(seconds: float) -> Callable[[], bool]:
    """True from ``seconds`` after its first call (the plain server has no ledger to watch)."""
    first: list[float] = []

    def due() -> bool:
        if not first:
            first.append(time.monotonic())
        return time.monotonic() - first[0] >= seconds

    return due


def _hog_running(redis_url: str) -> bool:
    """The ledger has the hog call started and unanswered (so OpenClaw's kill cancels it)."""
    client = store_client(redis_url)
    try:
        for key in client.scan_iter(match="*:call:*", count=1000):
            fields = client.hmget(key, ["started_ms", "result", "job"])
            if fields[0] and not fields[1] and "hog" in str(fields[2] or ""):
                return True
        return False
    finally:
        client.close()


def _answer_seconds(model: MockModel, step: int) -> float | None:
    if step >= len(model.sent):
        return None
    sent = model.sent[step].at
    later = [at for at in model.received_at if at > sent]
    return later[0] - sent if later else None


def _figures(
    turn: Turn, scenarios: list[tuple[str, Step]], server: str, transport: str, tool_search: bool, ledger: Any
) -> list[tuple[Figure, list[list[str]]]]:
    transcript = turn.transcript()
    results = _results(transcript)
    turns = _calling_turns(transcript, tool_search)
    out = []
    for step, (name, _) in enumerate(scenarios):
        call_ids = turns[step] if step < len(turns) else []
        texts = [results.get(call_id, []) for call_id in call_ids]
        counts = ",".join(str(len(t)) for t in texts) or "-"
        whos = sorted({_who(t[0], ledger, server) for t in texts if t})
        figure = Figure(
            server,
            transport,
            tool_search,
            name,
            _answer_seconds(turn.model, step),
            "; ".join(whos) or "-",
            counts,
        )
        out.append((figure, texts))
    return out


def _run(
    backbone: Backbone, server: str, transport: str, tool_search: bool
) -> tuple[Turn, list[tuple[Figure, list[list[str]]]], list[tuple[str, str, str]]]:
    scenarios = SCENARIOS if server == "unstuck" else PLAIN_SCENARIOS
    hogs_before = len(_hog_answers(backbone.redis_url))
    model = MockModel(plan=[step for _, step in scenarios]).start()
    home = Path(tempfile.mkdtemp(prefix="unstuck-openclaw-"))
    plain_port = free_port()
    plain_proc: subprocess.Popen[bytes] | None = None
    marker = backbone.redis_url if server == "unstuck" else str(home)
    kill_when: Callable[[], bool] = functools.partial(_hog_running, backbone.redis_url)
    if server == "unstuck":
        entry = (
            {"url": backbone.door_url, "transport": "streamable-http"}
            if transport == "http"
            else _stdio_unstuck(backbone, CLIENT_TIMEOUT_S)
        )
    else:
        # No ledger to watch: the kill comes a moment after the call was sent.
        kill_when = _a_moment_later(2.0)
        if transport == "http":
            plain_proc = subprocess.Popen(
                [sys.executable, "-m", "tests.openclaw.plain_server", "http", str(plain_port)], cwd=REPO
            )
            wait_until(lambda: _port_open(plain_port), timeout_s=30, what="plain server")
            entry = {"url": f"http://127.0.0.1:{plain_port}/mcp", "transport": "streamable-http"}
        else:
            args = ["-m", "tests.openclaw.plain_server", "stdio", str(home)]
            entry = {"command": sys.executable, "args": args, "cwd": str(REPO)}
    entry.update(_timeout_fields(CLIENT_TIMEOUT_S))
    try:
        config = _config(model, server, entry, tool_search)
        turn = _run_openclaw(config, model, home, kill_when=kill_when, marker=marker)
    finally:
        model.stop()
        if plain_proc is not None:
            plain_proc.kill()
            plain_proc.wait()
    ledger = _ledger_texts(backbone.redis_url) if server == "unstuck" else []
    figures = _figures(turn, scenarios, server, transport, tool_search, ledger)
    if server == "unstuck":
        cancelled = figures[-1][0]
        cancelled.seconds, cancelled.who = _cancel_answer(backbone.redis_url, turn.killed_at, hogs_before)
    FIGURES.extend(figure for figure, _ in figures)
    return turn, figures, ledger


def _hog_answers(redis_url: str) -> list[str]:
    return [reason for tool, reason, _ in _ledger_texts(redis_url) if tool == "hog"]


def _cancel_answer(redis_url: str, killed_at: float, before: int) -> tuple[float | None, str]:
    """How long after OpenClaw was killed the ledger answered this run's hog call, and how."""
    try:
        wait_until(lambda: len(_hog_answers(redis_url)) > before, timeout_s=10)
    except AssertionError:
        return None, "nobody (hog unanswered)"
    answered_s = time.monotonic() - killed_at
    reasons = _hog_answers(redis_url)
    return answered_s, f"unstuck ({','.join(sorted(set(reasons)))}, ledger only)"


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _by_name(figures: list[tuple[Figure, list[list[str]]]]) -> dict[str, tuple[Figure, list[list[str]]]]:
    return {figure.scenario: (figure, texts) for figure, texts in figures}


@pytest.mark.parametrize(
    ("transport", "tool_search"), [("http", False), ("stdio", False), ("http", True), ("stdio", True)]
)
@pytest.mark.timeout(600)
def test_openclaw_through_unstuck(backbone: Backbone, transport: str, tool_search: bool) -> None:
    turn, figures, _ = _run(backbone, "unstuck", transport, tool_search)
    scenarios = _by_name(figures)
    for figure, _ in figures:
        print(figure.row())
    # Then every tool_call OpenClaw sent back before the kill has exactly one result
    answered = [texts for name, (_, texts) in scenarios.items() if name != "cancelled"]
    assert all(len(texts) == 1 for step in answered for texts in step), [f.row() for f, _ in figures]
    assert all(step for step in answered), "a scenario's calls are missing from the transcript"
    # ... none of them OpenClaw's own timeout, and the tools' answers are unstuck's, as in the ledger
    assert not any("-32001" in texts[0] for step in answered for texts in step)
    for name in ("healthy", "hung", "slow", "late result", "parallel", "crash", "after crash"):
        figure = scenarios[name][0]
        assert figure.who.startswith("unstuck"), figure.row()
        assert figure.seconds is not None
        assert figure.seconds < CLIENT_TIMEOUT_S + 6, figure.row()  # the late result waits for the tool
    assert "timeout_hard" in scenarios["hung"][0].who
    assert "still_running" in scenarios["slow"][0].who
    assert scenarios["slow"][0].seconds is not None
    assert scenarios["slow"][0].seconds < CLIENT_TIMEOUT_S
    assert "slow done" in scenarios["late result"][1][0][0]
    assert "crashed" in scenarios["crash"][0].who
    assert "after" in scenarios["after crash"][1][0][0]
    # ... the call OpenClaw was killed during is answered cancelled, and nothing is left running
    assert "cancelled" in scenarios["cancelled"][0].who, scenarios["cancelled"][0].row()
    assert turn.leftovers == []


@pytest.mark.parametrize("transport", ["http", "stdio"])
@pytest.mark.timeout(600)
def test_openclaw_on_a_plain_server_for_comparison(backbone: Backbone, transport: str) -> None:
    turn, figures, _ = _run(backbone, "plain", transport, False)
    for figure, _ in figures:
        print(figure.row())
    # Figures only: what OpenClaw does without unstuck (its own -32001 after requestTimeoutMs)
    assert turn.model.requests


@pytest.mark.timeout(600)
def test_a_slow_tool_behind_openclaws_default_timeout_is_answered_by_unstuck(backbone: Backbone) -> None:
    # Given a door and OpenClaw both on their defaults (60 s), and a healthy 90 s tool
    door, url = _start_door(backbone.env, "mcp-default-timeout")
    model = MockModel(plan=[[("hog", {"seconds": 90})]]).start()
    entry = {"url": url, "transport": "streamable-http"}
    home = Path(tempfile.mkdtemp(prefix="unstuck-openclaw-"))
    try:
        turn = _run_openclaw(_config(model, "unstuck", entry, False), model, home)
    finally:
        model.stop()
        door.stop()
    transcript = turn.transcript()
    results = _results(transcript)
    ledger = _ledger_texts(backbone.redis_url)
    seconds = _answer_seconds(model, 0)
    texts = next(iter(results.values()))
    who = _who(texts[0], ledger, "unstuck")
    FIGURES.append(Figure("unstuck", "http (defaults)", False, "slow 90 s", seconds, who, str(len(texts))))
    print(FIGURES[-1].row())
    # Then the model got unstuck's still_running answer before OpenClaw's 60 s, as in the ledger
    assert len(texts) == 1
    assert "still_running" in who
    assert seconds is not None
    assert seconds < DEFAULT_TIMEOUT_S
    assert turn.envelope.get("ok") is True
    assert turn.leftovers == []


@pytest.fixture(scope="module", autouse=True)
def figures_table() -> Iterator[None]:
    yield
    header = [
        "| server | transport | Tool Search | scenario | answered after (s) | answered by "
        "| results per call |",
        "|---|---|---|---|---|---|---|",
    ]
    table = "\n".join(header + [figure.row() for figure in FIGURES])
    print("\n\nOpenClaw figures:\n" + table)
    target = os.environ.get("UNSTUCK_OPENCLAW_FIGURES")
    if target:
        Path(target).write_text(table + "\n")
