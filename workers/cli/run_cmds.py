"""Sub-commands that run processes: ``worker`` and ``beat``, each against the configured Redis."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

from workers.errors import ConfigError, StoreError
from workers.redact import redact_url
from workers.runtime import redis_client
from workers.settings import Settings, load_settings

__all__ = ["beat_argv", "preflight", "register", "worker_argv"]


def register(subparsers: Any) -> None:
    """Add the process sub-commands."""
    worker = subparsers.add_parser("worker", help="start a prefork worker that runs tool calls")
    worker.add_argument("-c", "--concurrency", type=int, help="pool processes (default: settings)")
    worker.add_argument("-n", "--hostname", default="unstuck@%h", help="worker node name")
    worker.add_argument("-l", "--loglevel", default="INFO")
    worker.set_defaults(func=_worker)
    beat = subparsers.add_parser("beat", help="start the scheduler (watchdog sweeps); run exactly one")
    beat.add_argument("-l", "--loglevel", default="INFO")
    beat.add_argument("--schedule-file", help="where beat keeps its state (default: a temp dir)")
    beat.set_defaults(func=_beat)
    version = subparsers.add_parser("version", help="print the version")
    version.set_defaults(func=_version)


def preflight(settings: Settings) -> None:
    """Fail fast, with the fix, when Redis is unreachable or tool modules do not import."""
    from workers.tools.loader import load_tools

    load_tools(settings.tool_modules)
    client = redis_client(settings)
    try:
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure here is the same advice
        raise StoreError(
            f"cannot reach Redis at {redact_url(settings.redis.url)} ({type(exc).__name__}); "
            "start it or fix UNSTUCK_REDIS__URL"
        ) from None
    finally:
        client.close()


def worker_argv(settings: Settings, args: argparse.Namespace) -> list[str]:
    """The celery command line of a worker: always prefork, events on, our queue."""
    return [
        sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker",
        "--pool", "prefork",
        "--concurrency", str(args.concurrency or settings.worker.concurrency),
        "--queues", settings.broker.queue,
        "--hostname", args.hostname,
        "--loglevel", args.loglevel,
        "--task-events",
        "--without-mingle", "--without-gossip",
    ]  # fmt: skip


def beat_argv(args: argparse.Namespace) -> list[str]:
    """The celery command line of beat."""
    schedule = args.schedule_file or os.path.join(tempfile.mkdtemp(prefix="unstuck-beat-"), "schedule")
    return [
        sys.executable, "-m", "celery", "-A", "workers.celery_app", "beat",
        "--loglevel", args.loglevel, "--schedule", schedule,
    ]  # fmt: skip


def _checked_settings() -> Settings | None:
    try:
        settings = load_settings()
        preflight(settings)
    except (ConfigError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    return settings


def _worker(args: argparse.Namespace) -> int:
    settings = _checked_settings()
    if settings is None:
        return 2
    argv = worker_argv(settings, args)
    os.execv(argv[0], argv)
    return 0  # not reached: execv replaces this process


def _beat(args: argparse.Namespace) -> int:
    if _checked_settings() is None:
        return 2
    argv = beat_argv(args)
    os.execv(argv[0], argv)
    return 0


def _version(args: argparse.Namespace) -> int:
    from importlib.metadata import version

    print(version("unstuck"))
    return 0
