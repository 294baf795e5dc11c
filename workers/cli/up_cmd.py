"""``unstuck up``: Redis, a worker, the watchdog, beat and the HTTP API here, until Ctrl-C or SIGTERM.

Redis is ``UNSTUCK_REDIS__URL`` when set, else an embedded redis-server started and stopped
here. The Redis URL and pids go to a state file (default ``<tmp>/unstuck-<uid>/up.json``,
removed on exit) so other commands can find them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from workers.errors import ConfigError, StoreError
from workers.local.up import (
    Interrupted,
    Stack,
    StackOptions,
    StartupError,
    default_state_file,
    remove_state,
    stop_on_signals,
    write_state,
)
from workers.local.up_events import DueWatcher, EventPrinter, StreamWatcher
from workers.runtime import build_runtime
from workers.settings import load_settings

__all__ = ["register"]

_EXIT_STARTUP = 2
_EXIT_CHILD_DIED = 1


def register(subparsers: Any) -> None:
    """Add the ``up`` sub-command."""
    parser = subparsers.add_parser("up", help="run Redis, a worker, the watchdog, beat and the HTTP API")
    parser.add_argument("--redis-port", type=int, help="port of the embedded Redis (default: a free one)")
    parser.add_argument("-c", "--concurrency", type=int, help="worker pool processes (default: settings)")
    parser.add_argument("--flower", action="store_true", help="also start Flower (web monitor)")
    parser.add_argument("--flower-port", type=int, default=5555, help="Flower port (default 5555)")
    parser.add_argument("--no-serve", action="store_true", help="do not start the HTTP API (unstuck serve)")
    parser.add_argument(
        "--serve-port", type=int, default=None, help="HTTP API port (default: api.port, 8765)"
    )
    parser.add_argument("--log-format", choices=("text", "json"), default="text", help="status line format")
    parser.add_argument("--state-file", type=Path, default=None, help=f"default {default_state_file()}")
    parser.add_argument("--stop-timeout", type=float, default=10.0, help="seconds from SIGTERM to SIGKILL")
    parser.add_argument("--poll-interval", type=float, default=0.2, help="seconds between event polls")
    parser.set_defaults(func=_up)


def _up(args: argparse.Namespace) -> int:
    printer = EventPrinter(sys.stdout, json_lines=args.log_format == "json")
    state_file: Path = args.state_file or default_state_file()
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return _EXIT_STARTUP
    options = StackOptions(
        redis_port=args.redis_port,
        flower_port=args.flower_port if args.flower else None,
        serve_port=None if args.no_serve else (args.serve_port or settings.api.port),
        concurrency=args.concurrency,
        stop_timeout_s=args.stop_timeout,
    )
    stack = Stack(settings, options)
    code = _EXIT_CHILD_DIED
    try:
        with stop_on_signals():
            stack.start()
            # The state file first: whoever reads "started" may read the file it names at once.
            write_state(state_file, stack.describe())
            printer.started(stack.describe(), state_file=str(state_file))
            code = _watch(stack, printer, args.poll_interval)
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = _EXIT_STARTUP
    except Interrupted:
        printer.emit("stopping", reason="signal")
        code = 0
    finally:
        stack.stop(remove_logs=code == 0)
        remove_state(state_file)
    if code != _EXIT_STARTUP:
        printer.emit("stopped", code=code)
    return code


def _watch(stack: Stack, printer: EventPrinter, poll_interval_s: float) -> int:
    """Report events until a child dies (exit 1) or a signal arrives (raises ``Interrupted``)."""
    rt = build_runtime(stack.settings)
    settings = stack.settings
    watcher = DueWatcher(
        rt.ledger, stalled_after_ms=int(settings.gateway.grace_s * 1000), report_answered=False
    )
    stream = StreamWatcher(rt.ledger)
    store_down = False
    while True:
        for child in stack.children():
            if not child.alive():
                printer.emit("exited", process=child.name, code=child.process.returncode, log=child.log_path)
                return _EXIT_CHILD_DIED
        try:
            # Blocks on the stream: events print as they happen, not on the next tick.
            for event in stream.poll(int(poll_interval_s * 1000)):
                printer.print(event)
            for event in watcher.poll(int(time.time() * 1000)):
                printer.print(event)
            store_down = False
        except StoreError as exc:
            if not store_down:
                printer.emit("store", problem=str(exc))
            store_down = True
            time.sleep(poll_interval_s)  # Redis is down: nothing to block on, retry later
