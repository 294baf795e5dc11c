"""Built-in tools: ``exec`` (a shell command in its own process group) and ``http_fetch``."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import time
from typing import Any
from urllib.parse import urlsplit

from workers.errors import ToolExecutionError
from workers.tools.context import ToolContext
from workers.tools.registry import tool

__all__ = ["exec_command", "http_fetch"]

MAX_OUTPUT_BYTES = 64 * 1024
TRUNCATED = "\n[... output truncated by unstuck ...]"


def _clip(data: bytes, limit: int = MAX_OUTPUT_BYTES) -> str:
    text = data[:limit].decode("utf-8", errors="replace")
    return text + TRUNCATED if len(data) > limit else text


def _kill_group(pgid: int) -> None:
    # The group outlives the shell when commands background children; kill all of it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@tool(name="exec", soft_timeout_s=None, heartbeat_timeout_s=None)
def exec_command(
    ctx: ToolContext, command: str, cwd: str | None = None, stdin: str | None = None
) -> dict[str, Any]:
    """Run a shell command; returns exit code and captured stdout/stderr.

    The command runs in its own process group, which is killed when the call ends for any
    reason (normal exit, soft limit, heartbeat interrupt); on a hard kill the worker's main
    process kills the group it recorded.
    """
    started = time.monotonic()
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command],
        cwd=cwd,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    ctx.register_process_group(proc.pid)
    try:
        stdout, stderr = _communicate(proc, ctx, stdin)
    finally:
        _kill_group(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
    return {
        "exit_code": proc.returncode,
        "stdout": _clip(stdout),
        "stderr": _clip(stderr),
        "duration_ms": int((time.monotonic() - started) * 1000),
    }


def _communicate(proc: subprocess.Popen[bytes], ctx: ToolContext, stdin: str | None) -> tuple[bytes, bytes]:
    data = stdin.encode() if stdin is not None else None
    while True:
        try:
            return proc.communicate(input=data, timeout=1.0)
        except subprocess.TimeoutExpired:
            data = None  # already written on the first round
            ctx.heartbeat({"pid": proc.pid, "running": True})


@tool(idempotent=True, soft_timeout_s=60.0)
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
        raise ToolExecutionError(f"unsupported URL {url!r}: need http:// or https:// and a host")
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
            "headers": dict(response.getheaders()),
            "body": _clip(data, max_bytes),
        }
    finally:
        conn.close()
