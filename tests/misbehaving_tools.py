"""Tools that misbehave in every way the backbone must survive (loaded by test workers)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from workers.core.models import RetryPolicy
from workers.errors import ToolExecutionError
from workers.tools import ToolContext, tool
from workers.tools.registry import get_tool

_ATTEMPTS: dict[str, int] = {}

#: Names a file every chaos tool appends one line to before its side effect (the chaos soak's
#: own history of executions, kept outside Redis); unset, the tools write nothing.
EXECUTIONS_FILE_ENV = "CHAOS_EXECUTIONS_FILE"


def _began(ctx: ToolContext, tool_name: str) -> None:
    path = os.environ.get(EXECUTIONS_FILE_ENV)
    if not path:
        return
    line = json.dumps(
        {
            "session": ctx.session_key,
            "run": ctx.run_id,
            "call": ctx.call_id,
            "attempt": ctx.attempt,
            "tool": tool_name,
            "idempotent": get_tool(tool_name).idempotent,
            # One execution: the tool's own retries reuse its context (and its attempt number).
            "execution": f"{os.getpid()}:{id(ctx)}",
            "ms": int(time.time() * 1000),
        }
    )
    # One write of one line, opened for append: lines of concurrent pool processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@tool(soft_timeout_s=5.0, idempotent=True)
def echo(ctx: ToolContext, text: str, times: int = 1) -> str:
    """Healthy tool."""
    _began(ctx, "echo")
    return text * times


@tool(soft_timeout_s=5.0)
def noop() -> str:
    """Does nothing (benchmarks)."""
    return "ok"


@tool(soft_timeout_s=1.0, hard_timeout_s=3.0)
def sleepy(seconds: float, ctx: ToolContext) -> str:
    """Sleeps (interruptible by the soft limit)."""
    _began(ctx, "sleepy")
    time.sleep(seconds)
    return "slept"


def _ignore_interrupts(seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            time.sleep(0.05)
        except BaseException:  # noqa: BLE001 - deliberately misbehaving
            continue
    return "never"


@tool(soft_timeout_s=1.0, hard_timeout_s=2.0)
def stubborn(seconds: float, ctx: ToolContext) -> str:
    """Ignores the soft limit: swallows every interrupt, so only the hard kill stops it (R2)."""
    _began(ctx, "stubborn")
    return _ignore_interrupts(seconds)


@tool(soft_timeout_s=140.0, hard_timeout_s=150.0)
def hog(seconds: float, ctx: ToolContext) -> str:
    """Holds its pool slot for ``seconds`` whatever interrupts it gets (a slot-hogging hang)."""
    _began(ctx, "hog")
    return _ignore_interrupts(seconds)


@tool(soft_timeout_s=5.0)
def crash(ctx: ToolContext, how: str = "sigkill") -> str:
    """Kills its own process (R1): ``sigkill`` (like the OOM killer), ``segv`` or ``exit``."""
    _began(ctx, "crash")
    if how == "segv":
        ctypes.string_at(0)
    if how == "exit":
        os._exit(3)
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@tool(soft_timeout_s=5.0)
def sigchld_handling() -> str:
    """How this pool child handles SIGCHLD (its tools' own children): 'default' or the handler's repr."""
    handler = signal.getsignal(signal.SIGCHLD)
    return "default" if handler == signal.SIG_DFL else repr(handler)


@tool(soft_timeout_s=5.0)
def boom(ctx: ToolContext, message: str = "broken") -> str:
    """Raises."""
    _began(ctx, "boom")
    raise ValueError(message)


@tool(soft_timeout_s=5.0, retry=RetryPolicy(attempts=3, backoff_s=0.05))
def flaky(key: str, failures: int, ctx: ToolContext) -> str:
    """Fails ``failures`` times with a retryable error, then succeeds."""
    _began(ctx, "flaky")
    _ATTEMPTS[key] = _ATTEMPTS.get(key, 0) + 1
    if _ATTEMPTS[key] <= failures:
        raise ToolExecutionError("transient", retryable=True)
    return f"ok after {_ATTEMPTS[key]}"


@tool(soft_timeout_s=1.0, hard_timeout_s=2.0, fallback={"status": "unknown"})
def optional_lookup(seconds: float) -> dict[str, Any]:
    """Non-critical: answers with its fallback when it times out."""
    time.sleep(seconds)
    return {"status": "fresh"}


@tool(soft_timeout_s=20.0, hard_timeout_s=25.0, heartbeat_timeout_s=1.5)
def beating(seconds: float, stop_beating_after: float, ctx: ToolContext) -> str:
    """Heartbeats for a while, then goes silent."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if time.monotonic() - start < stop_beating_after:
            ctx.heartbeat({"progress": round(time.monotonic() - start, 1)})
        time.sleep(0.05)
    return "finished"


@tool(soft_timeout_s=30.0, hard_timeout_s=40.0, idempotent=False)
def slow(seconds: float, ctx: ToolContext) -> str:
    """Takes a while (used to kill its worker mid-call)."""
    _began(ctx, "slow")
    time.sleep(seconds)
    return "slow done"


@tool(soft_timeout_s=30.0, hard_timeout_s=40.0, idempotent=True)
def slow_idempotent(seconds: float, ctx: ToolContext) -> str:
    """Takes a while; safe to re-run on another worker."""
    _began(ctx, "slow_idempotent")
    time.sleep(seconds)
    return "idempotent done"


@tool(soft_timeout_s=6.0, hard_timeout_s=7.0, idempotent=False)
def steady(seconds: float) -> str:
    """Takes a few seconds under a short deadline (Redis restarted mid-call)."""
    time.sleep(seconds)
    return "steady done"


@tool(soft_timeout_s=5.0)
def fragile(down_flag: str) -> str:
    """An upstream that is down while the file ``down_flag`` exists (circuit breaker tests)."""
    if os.path.exists(down_flag):
        raise ToolExecutionError("upstream is down")
    return "up"


@tool(soft_timeout_s=5.0)
def fetch_cached(url: str, seconds: float = 0.0) -> str:
    """The alternative a failed fetch branches to (same arguments)."""
    return f"cached copy of {url}"


@tool(soft_timeout_s=5.0)
def fetch_down(url: str, seconds: float = 0.0) -> str:
    """An external API that is down: every call raises."""
    raise ConnectionError(f"{url} is down")


@tool(soft_timeout_s=1.0, hard_timeout_s=4.0, fail_branch="fetch_cached", fail_branch_on=("timeout_soft",))
def fetch_slow(url: str, seconds: float = 10.0) -> str:
    """Too slow for its soft limit; its decorator branches to ``fetch_cached`` on a timeout."""
    time.sleep(seconds)
    return f"fresh copy of {url}"


RUNS_FILE_ENV = "RECORD_RUN_FILE"


@tool(soft_timeout_s=5.0)
def record_run(tag: str) -> str:
    """Appends ``tag`` to the file named by $RECORD_RUN_FILE: one line per execution."""
    path = os.environ.get(RUNS_FILE_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as runs:
            runs.write(tag.replace("\n", " ") + "\n")
    return f"recorded {tag}"


@tool(soft_timeout_s=20.0, hard_timeout_s=25.0, idempotent=True)
def record_attempt(ctx: ToolContext, tag: str, first_for_s: float = 0.0) -> str:
    """Appends ``<tag> <idempotency key> <attempt>`` to $RECORD_RUN_FILE; attempt 1 then sleeps.

    The line is written before anything else, as a side effect would be: one line per execution.
    """
    path = os.environ.get(RUNS_FILE_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as runs:
            runs.write(f"{tag} {ctx.idempotency_key} {ctx.attempt}\n")
    if ctx.attempt == 1:
        time.sleep(first_for_s)
    return f"{tag} attempt {ctx.attempt}"


MEMORY_LIMIT_MB = 256


def _filled(mb: int) -> bytes:
    return b"\x01" * (mb << 20)  # every page written, so every page is charged


@tool(soft_timeout_s=20.0, memory_limit_mb=MEMORY_LIMIT_MB)
def memory_hog(mb: int) -> str:
    """Allocates and fills ``mb`` MB in its own (the pool child's) process."""
    return f"held {len(_filled(mb)) >> 20} MB"


@tool(soft_timeout_s=20.0, memory_limit_mb=MEMORY_LIMIT_MB)
def memory_hog_child(mb: int) -> dict[str, Any]:
    """Starts a Python process that allocates and fills ``mb`` MB; returns how it ended."""
    done = subprocess.run(
        [sys.executable, "-c", f"data = b'\\x01' * ({mb} << 20); print(len(data) >> 20)"],
        capture_output=True,
        text=True,
        check=False,
    )
    return {"returncode": done.returncode, "stdout": done.stdout.strip(), "stderr": done.stderr[-300:]}
