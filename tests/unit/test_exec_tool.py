"""The built-in tools called through their registry specs: ``exec`` and ``http_fetch``."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest
from billiard.exceptions import SoftTimeLimitExceeded

from workers.core.tool_policy import BUILTIN_TOOLS
from workers.errors import ToolExecutionError
from workers.tools.builtins import MAX_OUTPUT_BYTES, TRUNCATED, enable_builtins
from workers.tools.context import ToolContext
from workers.tools.registry import get_tool, validate_arguments


@pytest.fixture(autouse=True)
def _builtins_enabled() -> Iterator[None]:
    # Built-ins are opt-in (tools.builtins); these tests use them through the registry.
    enable_builtins(BUILTIN_TOOLS)
    yield
    enable_builtins(())


class Recorder:
    """Context callbacks that record what the tool reports."""

    def __init__(self, on_beat: type[BaseException] | None = None) -> None:
        self.beats: list[Any] = []
        self.groups: list[int] = []
        self._on_beat = on_beat

    def heartbeat(self, details: Any) -> None:
        self.beats.append(details)
        if self._on_beat is not None:
            # A fresh instance each time: a stored one would keep the tool's frames (and its
            # Popen) alive through its __traceback__.
            raise self._on_beat()

    def ctx(self) -> ToolContext:
        return ToolContext(
            session_key="s",
            run_id="r",
            call_id="c",
            attempt=1,
            deadline_ms=0,
            clock=time.monotonic,
            on_heartbeat=self.heartbeat,
            on_process_group=self.groups.append,
        )


def _call(name: str, recorder: Recorder | None = None, **arguments: Any) -> Any:
    spec = get_tool(name)
    return spec.invoke(validate_arguments(spec, arguments), (recorder or Recorder()).ctx())


def _live_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` that are not zombies."""
    live = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid and _alive(pid):
                live.append(pid)
        except ProcessLookupError:
            continue
    return live


def _wait_group_dead(pgid: int, within_s: float = 1.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (live := _live_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return live


# --- exec -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "exit_code", "stdout", "stderr"),
    [
        ("echo hello", 0, "hello\n", ""),
        ("echo oops >&2; exit 3", 3, "", "oops\n"),
        ("printf 'a\\nb'; printf 'e' >&2; false", 1, "a\nb", "e"),
        ("exit 0", 0, "", ""),
        ("kill -TERM $$", -signal.SIGTERM, "", ""),
        ("no_such_command_zq", 127, "", "not found"),
    ],
)
def test_exec_captures_output_and_exit_code(command: str, exit_code: int, stdout: str, stderr: str) -> None:
    # When
    result = _call("exec", command=command)
    # Then
    assert result["exit_code"] == exit_code
    assert result["stdout"] == stdout
    assert stderr in result["stderr"]
    assert result["duration_ms"] >= 0


def test_exec_stdin_and_cwd(tmp_path: Path) -> None:
    result = _call("exec", command="cat; pwd", stdin="from stdin\n", cwd=str(tmp_path))
    assert result["stdout"] == f"from stdin\n{tmp_path}\n"


def test_exec_without_stdin_reads_nothing() -> None:
    assert _call("exec", command="cat")["stdout"] == ""


def test_exec_is_not_utf8_strict() -> None:
    assert _call("exec", command="printf '\\377ok'")["stdout"] == "\ufffdok"


@pytest.mark.parametrize(
    ("size", "stream", "truncated"),
    [
        (MAX_OUTPUT_BYTES, "stdout", False),
        (MAX_OUTPUT_BYTES + 1, "stdout", True),
        (MAX_OUTPUT_BYTES * 3, "stdout", True),
        (MAX_OUTPUT_BYTES + 1, "stderr", True),
    ],
)
def test_exec_output_is_truncated_over_64_kib(size: int, stream: str, truncated: bool) -> None:
    # Given
    redirect = " >&2" if stream == "stderr" else ""
    # When
    result = _call("exec", command=f"head -c {size} /dev/zero | tr '\\0' a{redirect}")
    # Then
    text = result[stream]
    assert MAX_OUTPUT_BYTES == 64 * 1024
    if truncated:
        assert text == "a" * MAX_OUTPUT_BYTES + TRUNCATED
        assert "truncated" in TRUNCATED
    else:
        assert text == "a" * size


def test_exec_runs_in_its_own_process_group_and_registers_it() -> None:
    # Given
    recorder = Recorder()
    # When: $$ is the shell's pid, and the shell leads its own group
    result = _call("exec", recorder, command="echo $$ $(ps -o pgid= -p $$)")
    # Then
    shell_pid, pgid = (int(part) for part in result["stdout"].split())
    assert recorder.groups == [shell_pid]
    assert pgid == shell_pid
    assert pgid != os.getpgrp()


def test_exec_kills_background_children_when_the_call_returns() -> None:
    # Given a command that leaves a child running (not holding the output pipes)
    recorder = Recorder()
    # When
    result = _call("exec", recorder, command="sleep 30 >/dev/null 2>&1 & echo $!")
    # Then the child, and every other member of the call's group, is gone
    child = int(result["stdout"])
    (pgid,) = recorder.groups
    # (process states rather than killpg(pgid, 0): killed members stay zombies until their new parent,
    # possibly a non-reaping pid 1 in a container, reaps them, and killpg still sees zombies.)
    assert _wait_group_dead(pgid) == []
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def test_exec_returns_when_the_shell_exits_even_if_a_background_child_holds_the_pipes() -> None:
    # Given
    recorder = Recorder()
    finished = threading.Event()

    def run() -> None:
        _call("exec", recorder, command="sleep 30 & echo started")
        finished.set()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    # When
    try:
        returned = finished.wait(0.8)
    finally:
        # Clean up either way: killing the group closes the pipes and ends the call.
        if not returned and recorder.groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(recorder.groups[0], signal.SIGKILL)
        worker.join(5)
    # Then
    assert returned


def test_exec_sends_heartbeats_while_a_command_runs() -> None:
    # Given
    recorder = Recorder()
    # When
    result = _call("exec", recorder, command="sleep 1.2; echo done")
    # Then
    assert result["stdout"] == "done\n"
    assert len(recorder.beats) == 1
    assert recorder.beats[0] == {"pid": recorder.groups[0], "running": True}


def test_exec_short_command_sends_no_heartbeat() -> None:
    recorder = Recorder()
    _call("exec", recorder, command="true")
    assert recorder.beats == []


def _interrupted_exec(recorder: Recorder) -> None:
    with pytest.raises(SoftTimeLimitExceeded):
        _call("exec", recorder, command="sleep 30 >/dev/null 2>&1 & sleep 30")


def test_exec_interrupted_mid_run_kills_its_whole_group() -> None:
    # Given a heartbeat during which the soft-limit interrupt arrives (also sent on a stale
    # heartbeat and after a cancel's grace)
    recorder = Recorder(on_beat=SoftTimeLimitExceeded)
    # When
    with warnings.catch_warnings():
        # The pipes this leaks are a separate bug (next test); keep them out of this verdict.
        warnings.simplefilter("ignore", ResourceWarning)
        _interrupted_exec(recorder)
        gc.collect()
    # Then
    (pgid,) = recorder.groups
    assert _wait_group_dead(pgid) == []


def test_exec_interrupted_mid_run_closes_its_pipes() -> None:
    # Given
    recorder = Recorder(on_beat=SoftTimeLimitExceeded)
    # When
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        _interrupted_exec(recorder)
        gc.collect()
    # Then
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


# --- http_fetch -----------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        first = self.path.strip("/").split("?")[0]
        status = int(first) if first.isdigit() else 200
        body = b"x" * 5000 if "big" in self.path else f"{self.command} {self.path}".encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Test", "yes")
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length)
        echoed = body + b"|" + self.headers.get("X-Token", "").encode()
        self.send_response(201)
        self.send_header("Content-Length", str(len(echoed)))
        self.end_headers()
        self.wfile.write(echoed)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(2)


@pytest.mark.parametrize(("path", "status"), [("/200", 200), ("/404", 404), ("/503?q=1", 503)])
def test_http_fetch_status_and_body(http_server: str, path: str, status: int) -> None:
    result = _call("http_fetch", url=http_server + path)
    assert result["status"] == status
    assert result["body"] == f"GET {path}"
    assert result["headers"]["X-Test"] == "yes"


def test_http_fetch_post_with_headers(http_server: str) -> None:
    result = _call(
        "http_fetch", url=http_server + "/", method="post", body="payload", headers={"X-Token": "t"}
    )
    assert (result["status"], result["body"]) == (201, "payload|t")


def test_http_fetch_caps_the_body(http_server: str) -> None:
    result = _call("http_fetch", url=http_server + "/big", max_bytes=100)
    assert result["body"] == "x" * 100 + TRUNCATED


@pytest.fixture
def silent_server() -> Iterator[tuple[str, socket.socket]]:
    # Listens but never accepts: the kernel completes handshakes into the backlog, nobody answers.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(0)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/", sock
    finally:
        sock.close()


def test_http_fetch_read_timeout_is_retryable(silent_server: tuple[str, socket.socket]) -> None:
    # Given
    url, _ = silent_server
    started = time.monotonic()
    # When
    with pytest.raises(ToolExecutionError) as info:
        _call("http_fetch", url=url, read_timeout_s=0.2)
    # Then
    assert info.value.retryable is True
    assert "read timed out after 0.2s" in str(info.value)
    assert time.monotonic() - started < 1.0


def test_http_fetch_connect_timeout_is_retryable(silent_server: tuple[str, socket.socket]) -> None:
    # Given a full accept queue, so further SYNs are dropped and connect() hangs
    url, sock = silent_server
    port = sock.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        time.sleep(0.05)
        started = time.monotonic()
        # When
        with pytest.raises(ToolExecutionError) as info:
            _call("http_fetch", url=url, connect_timeout_s=0.2, read_timeout_s=5.0)
    finally:
        for filler in fillers:
            filler.close()
    # Then
    assert info.value.retryable is True
    assert "connect timed out after 0.2s" in str(info.value)
    assert time.monotonic() - started < 1.0


def test_http_fetch_connection_refused_is_retryable() -> None:
    # Given a port nobody listens on
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    # When / Then
    with pytest.raises(ToolExecutionError, match="cannot connect") as info:
        _call("http_fetch", url=f"http://127.0.0.1:{port}/", connect_timeout_s=0.5)
    assert info.value.retryable is True


@pytest.mark.parametrize(
    "url", ["ftp://example.com/x", "file:///etc/passwd", "http:///nohost", "example.com"]
)
def test_http_fetch_refuses_unsupported_urls(url: str) -> None:
    with pytest.raises(ToolExecutionError, match="unsupported URL") as info:
        _call("http_fetch", url=url)
    assert info.value.retryable is False


def test_http_fetch_is_declared_idempotent() -> None:
    spec = get_tool("http_fetch")
    assert spec.idempotent
    assert not get_tool("exec").idempotent
