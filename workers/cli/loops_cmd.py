"""``unstuck loops replay FILE``: replay a recorded call sequence through the real loop check.

Prints a JSON array aligned 1:1 with ``calls``. With an ``expect`` array in the input it
prints every difference on stderr and exits 1 on any mismatch. Bad input prints one line
naming the JSON path and exits 2. ``--store redis`` replays through the Redis history under
a throwaway session key and deletes that session's keys afterwards.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from workers.core.loops import InMemoryLoopHistory, LoopHistory, compare_expectations, replay
from workers.errors import ConfigError, StoreError, UnstuckError

__all__ = ["register"]

_EXIT_MISMATCH = 1
_EXIT_BAD_INPUT = 2


def register(subparsers: Any) -> None:
    """Add the ``loops`` sub-command group."""
    loops = subparsers.add_parser("loops", help="loop detection tools")
    commands = loops.add_subparsers(dest="loops_command", metavar="SUBCOMMAND", required=True)
    run = commands.add_parser(
        "replay",
        help="replay a recorded call sequence (JSON: config, calls, expect; see docs/loop-detection.md)",
    )
    run.add_argument("file", help="JSON file to replay, or - for stdin")
    run.add_argument("--store", choices=("memory", "redis"), default="memory")
    run.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    run.add_argument("--prefix", default="unstuck", help="Redis key prefix")
    run.set_defaults(func=_replay)


def _replay(args: argparse.Namespace) -> int:
    try:
        spec_obj = _load(args.file)
        with _history_factory(args) as factory:
            verdicts = replay(spec_obj, factory.make, session_key=factory.session_key)
    except ConfigError as exc:
        path, reason = exc.problems[0] if exc.problems else ("$", str(exc))
        print(f"unstuck loops replay: {path}: {reason}", file=sys.stderr)
        return _EXIT_BAD_INPUT
    except UnstuckError as exc:
        print(f"unstuck loops replay: {exc}", file=sys.stderr)
        return _EXIT_BAD_INPUT
    print(json.dumps(verdicts, indent=2))
    if isinstance(spec_obj, dict) and "expect" in spec_obj:
        problems = compare_expectations(verdicts, spec_obj["expect"])
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            return _EXIT_MISMATCH
    return 0


def _load(file: str) -> Any:
    try:
        if file == "-":
            return json.load(sys.stdin)
        with open(file, encoding="utf-8") as handle:
            return json.load(handle)
    except OSError as exc:
        raise ConfigError([(file, exc.strerror or str(exc))]) from None
    except json.JSONDecodeError as exc:
        raise ConfigError([("$", f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")]) from None


class _Factory:
    def __init__(self, make: Callable[[], LoopHistory], session_key: str) -> None:
        self.make = make
        self.session_key = session_key


@contextmanager
def _history_factory(args: argparse.Namespace) -> Iterator[_Factory]:
    if args.store == "memory":
        yield _Factory(InMemoryLoopHistory, "replay")
        return
    # Imported here so the memory replay works without a Redis client configured.
    from workers.store.loop_history import RedisLoopHistory

    session_key = f"replay-{uuid.uuid4().hex}"
    store = RedisLoopHistory.from_url(args.redis_url, prefix=args.prefix, ttl_s=600)
    try:
        yield _Factory(lambda: store, session_key)
    finally:
        # Store errors already surfaced as StoreError; clean-up must not mask them.
        with suppress(StoreError):
            store.delete_session(session_key)
        store.close()
