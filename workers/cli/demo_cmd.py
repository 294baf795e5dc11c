"""``unstuck demo``: a scripted agent session whose tools misbehave in every way."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``demo`` sub-command."""
    parser = subparsers.add_parser("demo", help="run a scripted session whose tools misbehave in every way")
    parser.add_argument("--json", action="store_true", help="print the calls and the invariant as JSON")
    parser.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from workers.local.demo import run_demo

    return run_demo(json_output=args.json)
