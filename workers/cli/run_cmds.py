"""Sub-commands that run processes: worker, beat (filled in by the backbone)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the process sub-commands."""
    version = subparsers.add_parser("version", help="print the version")
    version.set_defaults(func=_version)


def _version(args: argparse.Namespace) -> int:
    from importlib.metadata import version

    print(version("unstuck"))
    return 0
