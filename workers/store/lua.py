"""The one Lua loader: scripts ship in ``workers/store/scripts`` and are registered from here.

Scripts that change a call get the run-summary helpers of ``lib_run_summary.lua`` prepended,
so every writer keeps the run's summary the same way.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import redis

__all__ = ["SUMMARY_LIBRARY", "load_script", "script_source", "script_text"]

SUMMARY_LIBRARY = "lib_run_summary.lua"


@cache
def script_text(name: str) -> str:
    """The source of ``scripts/<name>``."""
    return resources.files("workers.store").joinpath("scripts", name).read_text(encoding="utf-8")


def script_source(name: str, *, with_summary: bool = False) -> str:
    """What is registered for ``scripts/<name>``: the script, after the summary helpers if asked."""
    text = script_text(name)
    return script_text(SUMMARY_LIBRARY) + text if with_summary else text


def load_script(client: redis.Redis, name: str, *, with_summary: bool = False) -> Any:
    """Register ``scripts/<name>`` on ``client`` (EVALSHA, falling back to EVAL once)."""
    return client.register_script(script_source(name, with_summary=with_summary))
