"""The one Lua loader: scripts ship in ``workers/store/scripts`` and are registered from here.

Scripts that change a call get the run-summary helpers of ``lib_run_summary.lua`` prepended,
so every writer keeps the run's summary the same way; the loop-history scripts get the
detector-state helpers of ``lib_loop_state.lua``.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

__all__ = [
    "LOOP_STATE_LIBRARY",
    "SUMMARY_LIBRARY",
    "load_script",
    "run_script",
    "script_source",
    "script_text",
]

SUMMARY_LIBRARY = "lib_run_summary.lua"
LOOP_STATE_LIBRARY = "lib_loop_state.lua"


@cache
def script_text(name: str) -> str:
    """The source of ``scripts/<name>``."""
    return resources.files("workers.store").joinpath("scripts", name).read_text(encoding="utf-8")


def script_source(name: str, *, with_summary: bool = False, library: str | None = None) -> str:
    """What is registered for ``scripts/<name>``: the script after the helpers asked for.

    ``with_summary`` prepends the run-summary helpers; ``library`` names another helper file.
    """
    text = script_text(name)
    if library is not None:
        text = script_text(library) + text
    return script_text(SUMMARY_LIBRARY) + text if with_summary else text


def load_script(
    client: redis.Redis, name: str, *, with_summary: bool = False, library: str | None = None
) -> Any:
    """Register ``scripts/<name>`` on ``client`` (EVALSHA, falling back to EVAL once)."""
    return client.register_script(script_source(name, with_summary=with_summary, library=library))


def run_script(client: redis.Redis, script: Script, keys: list[str], args: list[Any]) -> Any:
    """Run a registered script with one ``EVALSHA``; after a restart that lost it, load it and retry once.

    What ``Script.__call__`` does, with less Python around it: its per-call work (an import,
    tuple copies, two more frames) is a visible share of the loop check, whose target is
    measured in PINGs (docs/performance.md).
    """
    try:
        return client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)  # type: ignore[no-untyped-call]
    except NoScriptError:
        script.sha = client.script_load(script.script)
        return client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)  # type: ignore[no-untyped-call]
