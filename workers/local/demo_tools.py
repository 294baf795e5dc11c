"""Tools of ``unstuck demo``: two healthy ones and one for each way a tool can misbehave.

Loaded by the demo's own worker through ``UNSTUCK_TOOL_MODULES=workers.local.demo_tools``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

from workers.tools.registry import tool

__all__ = ["add", "flaky_api", "hang", "lookup_weather", "oom_kill", "search_docs", "segfault", "slow_report"]


@tool(soft_timeout_s=5.0, idempotent=True)
def lookup_weather(city: str) -> dict[str, object]:
    """Healthy: answers at once."""
    return {"city": city, "forecast": "sunny", "celsius": 21}


@tool(soft_timeout_s=5.0, idempotent=True)
def search_docs(query: str, limit: int = 3) -> list[str]:
    """Healthy: answers at once."""
    return [f"{query} — result {i + 1}" for i in range(limit)]


@tool(soft_timeout_s=5.0)
def add(a: int, b: int) -> int:
    """Healthy, with a typed schema (the demo calls it with a wrong type, R5)."""
    return a + b


@tool(soft_timeout_s=5.0)
def flaky_api() -> str:
    """Raises: the model gets an error result with the type and message, no traceback."""
    raise ConnectionError("upstream returned 503")


@tool(soft_timeout_s=5.0)
def segfault() -> str:
    """Crashes its process with SIGSEGV (R1)."""
    ctypes.string_at(0)
    return "unreachable"


@tool(soft_timeout_s=5.0)
def oom_kill() -> str:
    """Dies by SIGKILL, which is what the kernel's OOM killer sends (R1)."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@tool(soft_timeout_s=1.0, hard_timeout_s=2.0)
def hang() -> str:
    """Hangs and swallows the soft-limit interrupt, so only the hard kill stops it (R2)."""
    while True:
        try:
            time.sleep(0.05)
        except BaseException:  # noqa: BLE001 - deliberately ignores every interrupt
            continue


@tool(soft_timeout_s=30.0, hard_timeout_s=40.0)
def slow_report(seconds: float) -> str:
    """Takes a while (its gateway or its worker is killed meanwhile: R3, R4)."""
    time.sleep(seconds)
    return f"report ready after {seconds:g}s"
