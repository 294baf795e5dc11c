"""Command lines of the processes unstuck runs, and the pre-flight check they share.

Used by the ``unstuck worker``/``beat``/``watchdog`` commands and by ``unstuck up``, which starts
the same processes: the one module outside ``workers.cli`` may import (an ``ignore_imports`` line
of the "Only the CLI imports the CLI" contract in ``pyproject.toml``).
"""

from __future__ import annotations

import os
import sys
import tempfile

from workers.core.mcp_upstreams import upstream_queue
from workers.core.redact import redact_url
from workers.errors import ConfigError, StoreError
from workers.settings import Settings
from workers.store.server import ping_error

__all__ = ["FLOWER_TASK_COLUMNS", "beat_argv", "flower_argv", "preflight", "watchdog_argv", "worker_argv"]

FLOWER_TASK_COLUMNS = "name,uuid,state,exception,result,received,runtime,worker"
"""The tasks page's columns: exception and result carry each call's reason (Flower hides them by default)."""


def preflight(settings: Settings, *, upstream: str = "") -> None:
    """Fail fast, with the fix, when Redis is unreachable or tool modules do not import.

    ``upstream``: the stateful MCP upstream a worker is to serve (``--upstream``): it must be one.
    """
    from workers.tools.loader import load_tools

    upstreams = settings.mcp.upstreams()
    if upstream and not (upstream in upstreams and upstreams[upstream].unstuck.stateful):
        stateful = sorted(name for name, entry in upstreams.items() if entry.unstuck.stateful)
        why = f"{upstream!r} is no stateful MCP upstream (stateful ones: {stateful or 'none'})"
        raise ConfigError([("unstuck worker --upstream", why)])
    load_tools(settings.tool_modules, builtins=settings.tools.builtins, upstreams=upstreams)
    failure = ping_error(
        settings.redis.url,
        socket_timeout_s=settings.redis.socket_timeout_s,
        socket_connect_timeout_s=settings.redis.socket_connect_timeout_s,
        cluster=settings.redis.cluster,
        sentinel=settings.redis.sentinel_access(),
    )
    if failure is not None:
        raise StoreError(
            f"cannot reach Redis at {redact_url(settings.redis.url)} ({failure}); "
            "start it or fix UNSTUCK_REDIS__URL"
        )


def worker_argv(
    settings: Settings, *, concurrency: int | None, hostname: str, loglevel: str, upstream: str = ""
) -> list[str]:
    """The celery command line of a tool worker: always prefork, events on, the tool queue only.

    A worker for a stateful MCP upstream (``upstream``) takes that upstream's queue instead,
    with one pool child: its one upstream process is the one every client meets.
    """
    return [
        sys.executable, "-m", "celery", "-A", "workers.celery_edge.app", "worker",
        "--pool", "prefork",
        "--concurrency", "1" if upstream else str(concurrency or settings.worker.concurrency),
        "--queues", upstream_queue(settings.broker.queue, upstream) if upstream else settings.broker.queue,
        "--hostname", hostname,
        "--loglevel", loglevel,
        "--task-events",
        "--without-mingle", "--without-gossip",
    ]  # fmt: skip


def watchdog_argv(settings: Settings, *, hostname: str, loglevel: str) -> list[str]:
    """The celery command line of the watchdog: the control queue only, one sweep at a time.

    Prefork with one child, so a sweep that hangs is killed at its hard limit and the next
    one still runs; the control app registers no tool task, so this process runs no tools.
    """
    return [
        sys.executable, "-m", "celery", "-A", "workers.celery_edge.app:control_app", "worker",
        "--pool", "prefork",
        "--concurrency", "1",
        "--queues", settings.broker.control_queue,
        "--hostname", hostname,
        "--loglevel", loglevel,
        "--task-events",
        "--without-mingle", "--without-gossip",
    ]  # fmt: skip


def beat_argv(*, loglevel: str, schedule_file: str | None) -> list[str]:
    """The celery command line of beat (``schedule_file`` default: a fresh temp dir)."""
    schedule = schedule_file or os.path.join(tempfile.mkdtemp(prefix="unstuck-beat-"), "schedule")
    return [
        sys.executable, "-m", "celery", "-A", "workers.celery_edge.app:control_app", "beat",
        "--loglevel", loglevel, "--schedule", schedule,
    ]  # fmt: skip


def flower_argv(port: int, address: str) -> list[str]:
    """The Flower command line: our Celery app (so our broker), the port, the address, our columns."""
    return [
        sys.executable, "-m", "celery", "-A", "workers.celery_edge.app", "flower",
        f"--tasks_columns={FLOWER_TASK_COLUMNS}", f"--port={port}", f"--address={address}",
    ]  # fmt: skip
