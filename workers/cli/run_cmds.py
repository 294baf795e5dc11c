"""Sub-commands that run processes: ``worker``, ``watchdog`` and ``beat``, against the configured Redis."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from workers.cli.launch import beat_argv, preflight, watchdog_argv, worker_argv
from workers.errors import ConfigError, StoreError
from workers.settings import Settings, load_settings

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the process sub-commands."""
    worker = subparsers.add_parser("worker", help="start a prefork worker that runs tool calls")
    worker.add_argument("-c", "--concurrency", type=int, help="pool processes (default: settings)")
    worker.add_argument("-n", "--hostname", default="unstuck@%h", help="worker node name")
    worker.add_argument("-l", "--loglevel", default="INFO")
    worker.add_argument(
        "--upstream",
        help="run only the calls of this stateful MCP upstream (mcp.upstreams_file), with one pool child",
    )
    worker.set_defaults(func=_worker)
    watchdog = subparsers.add_parser(
        "watchdog", help="start the watchdog: runs the sweeps beat schedules, never a tool"
    )
    watchdog.add_argument("-n", "--hostname", default="unstuck-watchdog@%h", help="node name")
    watchdog.add_argument("-l", "--loglevel", default="INFO")
    watchdog.set_defaults(func=_watchdog)
    beat = subparsers.add_parser("beat", help="start the scheduler (watchdog sweeps); run exactly one")
    beat.add_argument("-l", "--loglevel", default="INFO")
    beat.add_argument("--schedule-file", help="where beat keeps its state (default: a temp dir)")
    beat.set_defaults(func=_beat)
    version = subparsers.add_parser("version", help="print the version")
    version.set_defaults(func=_version)


def _checked_settings(*, upstream: str = "") -> Settings | None:
    try:
        settings = load_settings()
        preflight(settings, upstream=upstream)
    except (ConfigError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    return settings


def _worker(args: argparse.Namespace) -> int:
    settings = _checked_settings(upstream=args.upstream or "")
    if settings is None:
        return 2
    return _celery(
        worker_argv(
            settings,
            concurrency=args.concurrency,
            hostname=args.hostname,
            loglevel=args.loglevel,
            upstream=args.upstream or "",
        )
    )


def _watchdog(args: argparse.Namespace) -> int:
    settings = _checked_settings()
    if settings is None:
        return 2
    return _celery(watchdog_argv(settings, hostname=args.hostname, loglevel=args.loglevel))


def _beat(args: argparse.Namespace) -> int:
    if _checked_settings() is None:
        return 2
    return _celery(beat_argv(loglevel=args.loglevel, schedule_file=args.schedule_file))


def _celery(argv: list[str]) -> int:
    """Run ``argv`` (``python -m celery ...``) as Celery's own command line, in this process.

    The same as exec'ing it, without a second interpreter start that imports everything
    again (about 0.3 CPU-seconds and half a second before the process is ready).
    """
    from celery.__main__ import main as celery_main

    if argv[1:3] != ["-m", "celery"]:
        raise ValueError(f"not a celery command line: {argv[:3]}")
    sys.argv = ["celery", *argv[3:]]
    celery_main()  # exits the process with Celery's status
    return 0


def _version(args: argparse.Namespace) -> int:
    from importlib.metadata import version

    print(version("unstuck"))
    return 0
