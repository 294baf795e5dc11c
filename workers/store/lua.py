"""The one Lua loader: scripts ship in ``workers/store/scripts`` and are registered from here.

Scripts that change a call get the run-summary helpers of ``lib_run_summary.lua`` prepended,
so every writer keeps the run's summary the same way; the loop-history scripts get the
detector-state helpers of ``lib_loop_state.lua``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError

__all__ = [
    "LOOP_STATE_LIBRARY",
    "SUMMARY_LIBRARY",
    "ScriptStep",
    "load_script",
    "run_script",
    "run_scripts",
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


@dataclass(frozen=True)
class ScriptStep:
    """One run of a registered script, for :func:`run_scripts`: its ``KEYS`` (one slot) and ``ARGV``."""

    script: Script
    keys: list[str]
    args: list[Any]


def run_scripts(client: redis.Redis, steps: Sequence[ScriptStep]) -> list[Any]:
    """Run single-slot scripts in the order given, in one round trip on one node; their replies.

    On one node, a pipeline without a transaction: each script stays atomic and the primary
    runs them one after the other, so a crash part way leaves the first ones done, as when
    each waited for the one before. A script a Redis restart lost is loaded and run again
    alone, after the others; any other error is raised once every step was sent. On a
    cluster the steps' slots are on different nodes, which would run them in no set order:
    there each step still waits for the one before, and a failed step stops those after it.
    """
    if isinstance(client, RedisCluster):
        return [run_script(client, step.script, step.keys, step.args) for step in steps]
    pipe = client.pipeline(transaction=False)
    for step in steps:
        pipe.execute_command("EVALSHA", step.script.sha, len(step.keys), *step.keys, *step.args)  # type: ignore[no-untyped-call]
    replies: list[Any] = pipe.execute(raise_on_error=False)
    for i, (step, reply) in enumerate(zip(steps, replies, strict=True)):
        if isinstance(reply, NoScriptError):
            step.script.sha = client.script_load(step.script.script)
            replies[i] = run_script(client, step.script, step.keys, step.args)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies
