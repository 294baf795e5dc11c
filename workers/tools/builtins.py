"""Built-in tools: ``exec`` (a shell command in its own process group) and ``http_fetch``.

Importing this module registers nothing: a shell on the worker host is opt-in.
:func:`enable_builtins` registers the ones named in ``tools.builtins`` (and unregisters the
others, so the registry follows the settings the process was last loaded with).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import IO, Any
from urllib.parse import urlsplit

import psutil

from workers.core.redact import redact_mapping, redact_url
from workers.errors import ConfigError, ToolExecutionError
from workers.tools.context import ToolContext
from workers.tools.registry import tool, unregister

__all__ = ["enable_builtins", "exec_command", "http_fetch"]

MAX_OUTPUT_BYTES = 64 * 1024
TRUNCATED = "\n[... output truncated by unstuck ...]"
_POLL_S = 0.2  # how often a running command looks for a cancel (ctx throttles the store reads)
_BEAT_S = 1.0  # how often it heartbeats


def _clip(data: bytes, limit: int = MAX_OUTPUT_BYTES) -> str:
    text = data[:limit].decode("utf-8", errors="replace")
    return text + TRUNCATED if len(data) > limit else text


def _kill_group(pgid: int) -> None:
    # The group outlives the shell when commands background children; kill all of it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def exec_command(
    ctx: ToolContext, command: str, cwd: str | None = None, stdin: str | None = None
) -> dict[str, Any]:
    """Run a shell command; returns exit code and captured stdout/stderr.

    The command runs in its own process group, which is killed when the shell exits and
    whenever the call ends early (soft limit, heartbeat interrupt); on a hard kill the
    worker's main process kills the group it recorded. When the call is cancelled the group
    gets SIGTERM, then SIGKILL after ``limits.cancel_grace_s``, and the output so far is
    returned (it becomes the ``partial`` of the ``cancelled`` answer). Output goes to temporary files, so
    a backgrounded child holding the output open cannot keep the call waiting.
    """
    started = time.monotonic()
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryFile() as inp,
    ):
        if stdin is not None:
            inp.write(stdin.encode())
            inp.seek(0)
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            cwd=cwd,
            stdin=inp if stdin is not None else subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        ctx.register_process_group(proc.pid)
        try:
            _wait_with_heartbeats(proc, ctx)
        finally:
            _kill_group(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
        return {
            "exit_code": proc.returncode,
            "stdout": _read_clipped(out),
            "stderr": _read_clipped(err),
            "duration_ms": int((time.monotonic() - started) * 1000),
        }


def _read_clipped(file: IO[bytes]) -> str:
    file.seek(0)
    return _clip(file.read(MAX_OUTPUT_BYTES + 1))


def _wait_with_heartbeats(proc: subprocess.Popen[bytes], ctx: ToolContext) -> None:
    next_beat = time.monotonic() + _BEAT_S
    while True:
        try:
            proc.wait(timeout=_POLL_S)
            return
        except subprocess.TimeoutExpired:
            if time.monotonic() >= next_beat:
                ctx.heartbeat({"pid": proc.pid, "running": True})
                next_beat = time.monotonic() + _BEAT_S
            if ctx.cancelled:
                _stop_group(proc, ctx.cancel_grace_s)
                return


def _stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the whole group and give it ``grace_s`` to exit (the caller SIGKILLs what is left)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end:
        proc.poll()  # reap the shell
        if not _group_alive(proc.pid):
            return
        time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    # Not kill(-pgid, 0): it succeeds on zombies, and an orphaned child's zombie may wait
    # long for its reaper (PID 1 in a container).
    for process in psutil.process_iter(["status"]):
        with contextlib.suppress(ProcessLookupError, psutil.Error):
            if process.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(process.pid) == pgid:
                return True
    return False


def http_fetch(
    url: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: str | None = None,
    connect_timeout_s: float = 5.0,
    read_timeout_s: float = 30.0,
    max_bytes: int = 1024 * 1024,
) -> dict[str, Any]:
    """Fetch a URL over HTTP(S) with separate connect and read timeouts; the body is capped."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ToolExecutionError(f"unsupported URL {redact_url(url)!r}: need http:// or https:// and a host")
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(parts.hostname, parts.port, timeout=connect_timeout_s)
    try:
        try:
            conn.connect()
        except TimeoutError:
            raise ToolExecutionError(
                f"connect timed out after {connect_timeout_s}s", retryable=True
            ) from None
        except OSError as exc:
            raise ToolExecutionError(f"cannot connect to {parts.hostname}: {exc}", retryable=True) from None
        if conn.sock is not None:
            conn.sock.settimeout(read_timeout_s)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        try:
            conn.request(method.upper(), path, body=body, headers=headers or {})
            response = conn.getresponse()
            data = response.read(max_bytes + 1)
        except TimeoutError:
            raise ToolExecutionError(f"read timed out after {read_timeout_s}s", retryable=True) from None
        return {
            "status": response.status,
            "headers": redact_mapping(dict(response.getheaders())),
            "body": _clip(data, max_bytes),
        }
    finally:
        conn.close()


# Memory: a shell command may run compilers, interpreters and test suites, so exec gets room
# for them; http_fetch holds one capped body (1 MB by default), and 256 MB leaves room for a
# much larger max_bytes.
_BUILTINS: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
    "exec": (exec_command, {"soft_timeout_s": None, "heartbeat_timeout_s": None, "memory_limit_mb": 2048}),
    "http_fetch": (http_fetch, {"idempotent": True, "soft_timeout_s": 60.0, "memory_limit_mb": 256}),
}


def enable_builtins(names: Iterable[str]) -> None:
    """Register the built-ins in ``names`` and unregister the others.

    Raises:
        ConfigError: a name is not a built-in, or another tool already uses its name.
    """
    wanted = set(names)
    unknown = wanted - set(_BUILTINS)
    if unknown:
        raise ConfigError([("tools.builtins", f"unknown built-in tool(s): {', '.join(sorted(unknown))}")])
    for name, (func, options) in _BUILTINS.items():
        if name in wanted:
            tool(name=name, **options)(func)
        else:
            unregister(name, func)
