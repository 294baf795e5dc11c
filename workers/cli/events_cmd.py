"""``unstuck events [--follow] [--json] [-n N]``: the cluster-wide events stream, from any host.

Every synthetic answer that won, loop warnings and blocks, sessions entering stalled or
stuck, late watchdogs, idle model streams and results delivered while Redis was away are
appended to one capped stream (``P:events``) by whichever process saw them. This command
prints the newest ``N`` of them and, with ``--follow``, every later one as it arrives (a
blocking read, so nothing is missed between polls). It reads the same settings as every
other process; no ``unstuck up`` is needed.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from workers.errors import ConfigError, StoreError
from workers.runtime import open_ledger
from workers.settings import load_settings
from workers.store.events import last_event_id, read_events, recent_events
from workers.store.ledger import Ledger
from workers.store.records import EventField

__all__ = ["format_event", "register"]

_FOLLOW_BLOCK_MS = 1000


def register(subparsers: Any) -> None:
    """Add the ``events`` sub-command."""
    events = subparsers.add_parser(
        "events", help="print the cluster-wide events stream (--follow to tail it)"
    )
    events.add_argument("-f", "--follow", action="store_true", help="keep printing new events until Ctrl-C")
    events.add_argument("--json", action="store_true", help="one JSON object per line")
    events.add_argument(
        "-n", "--lines", type=int, default=50, help="how many recent events first (default 50)"
    )
    events.set_defaults(func=_events)


def format_event(entry_id: str, fields: dict[str, Any], *, as_json: bool) -> str:
    """One line for one stream entry: its time (from the entry id), kind and fields."""
    values = {k: _decode(v) for k, v in fields.items() if k != EventField.KIND}
    kind = str(fields.get(EventField.KIND, "event"))
    at = datetime.fromtimestamp(int(entry_id.split("-")[0]) / 1000, tz=UTC)
    if as_json:
        stamp = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return json.dumps({"id": entry_id, "at": stamp, "event": kind, **values}, default=str)
    details = "  ".join(f"{k}={v}" for k, v in values.items() if v not in (None, ""))
    return f"{at.strftime('%Y-%m-%d %H:%M:%S')}Z  {kind:<17}  {details}"


def _decode(value: Any) -> Any:
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return value


def _events(args: argparse.Namespace) -> int:
    if args.lines < 0:
        print("error: -n/--lines must be 0 or more", file=sys.stderr)
        return 2
    try:
        ledger = open_ledger(load_settings())
        last_id = _print_recent(ledger, args.lines, as_json=args.json)
        while args.follow:
            for entry_id, fields in read_events(ledger, last_id, block_ms=_FOLLOW_BLOCK_MS):
                print(format_event(entry_id, fields, as_json=args.json), flush=True)
                last_id = entry_id
    except (ConfigError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


def _print_recent(ledger: Ledger, count: int, *, as_json: bool) -> str:
    """Print the newest ``count`` entries; returns the id to follow from (never misses one)."""
    last_id = last_event_id(ledger)
    entries = recent_events(ledger, count) if count else []
    for entry_id, fields in entries:
        print(format_event(entry_id, fields, as_json=as_json), flush=True)
    return entries[-1][0] if entries else last_id
