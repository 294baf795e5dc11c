"""The one Lua loader: scripts ship in ``workers/store/scripts`` and are registered from here.

Scripts that change a call get the run-summary helpers of ``lib_run_summary.lua`` prepended,
so every writer keeps the run's summary the same way.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import redis

__all__ = ["SUMMARY_LIBRARY", "load_script", "script_text"]

SUMMARY_LIBRARY = "lib_run_summary.lua"


@cache
def script_text(name: str) -> str:
    """The source of ``scripts/<name>``."""
    return resources.files("workers.store").joinpath("scripts", name).read_text(encoding="utf-8")


def load_script(client: redis.Redis, name: str, *, with_summary: bool = False) -> Any:
    """Register ``scripts/<name>`` on ``client`` (EVALSHA, falling back to EVAL once)."""
    text = script_text(name)
    if with_summary:
        text = script_text(SUMMARY_LIBRARY) + text
    return client.register_script(text)
