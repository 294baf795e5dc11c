"""Entry point of the ``unstuck`` command: one sub-command per module, registered below."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# Each module exposes ``register(subparsers)``, which adds its sub-command(s) and sets
# ``func(args) -> int`` as the parser default. Imported lazily so one broken optional
# command cannot take the others down, and start-up stays fast.
COMMAND_MODULES: tuple[str, ...] = (
    "workers.cli.run_cmds",
    "workers.cli.loops_cmd",
    "workers.cli.repair_cmd",
    "workers.cli.up_cmd",
    "workers.cli.demo_cmd",
    "workers.cli.config_cmd",
    "workers.cli.metrics_cmd",
    "workers.cli.flower_cmd",
    "workers.cli.session_cmd",
    "workers.cli.breakers_cmd",
    "workers.cli.events_cmd",
    "workers.cli.mcp_cmd",
    "workers.cli.serve_cmd",
    "workers.cli.openclaw_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="unstuck",
        description="Run agents' tool calls so that no session ever stays stuck.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
