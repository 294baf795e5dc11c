"""``unstuck mcp``: the registered tools for any MCP host (Streamable HTTP, or ``--stdio``).

A host may start a stdio server with a stripped environment (OpenClaw drops ``PYTHONPATH``
"for stdio startup safety"), so everything the door needs can be given as arguments too:
``--path`` (added to ``sys.path``), ``--tool-modules``, ``--config`` and ``--redis-url``
override the environment. A stdio door that cannot start answers the host's ``initialize``
with the reason (see :mod:`workers.servers.mcp_startup_error`) and prints it on stderr.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from typing import Any

from workers.cli.launch import preflight
from workers.errors import ConfigError, StoreError
from workers.servers.auth import check_exposure
from workers.servers.mcp_late_results import answer_within_s
from workers.settings import Settings, load_settings

__all__ = ["register", "settings_overrides"]


def register(subparsers: Any) -> None:
    """Add the ``mcp`` sub-command."""
    mcp = subparsers.add_parser(
        "mcp",
        help="serve the registered tools to MCP hosts (Streamable HTTP, or --stdio)",
        description="An MCP server whose every tools/call runs through unstuck: answered by its "
        "deadline whatever the tool does. Streamable HTTP at http://HOST:PORT/mcp (bearer tokens "
        "from UNSTUCK_API__TOKENS; loopback only without them), or stdio for one client.",
    )
    mcp.add_argument("--stdio", action="store_true", help="serve one client on stdin/stdout")
    mcp.add_argument("--host", help="address to bind (default: api.host, 127.0.0.1)")
    mcp.add_argument("--port", type=int, help="port (default: api.mcp_port, 8766)")
    mcp.add_argument(
        "--path",
        action="append",
        default=[],
        metavar="DIR",
        help="directory to add to sys.path before tool modules load (repeatable; for hosts "
        "that strip PYTHONPATH)",
    )
    mcp.add_argument(
        "--tool-modules",
        action="append",
        default=[],
        metavar="MODULES",
        help="comma-separated tool modules to import (repeatable; replaces UNSTUCK_TOOL_MODULES)",
    )
    mcp.add_argument("--config", metavar="FILE", help="config file (replaces UNSTUCK_CONFIG)")
    mcp.add_argument("--redis-url", metavar="URL", help="Redis URL (replaces UNSTUCK_REDIS__URL)")
    mcp.set_defaults(func=_mcp)


def settings_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line gives, as ``load_settings`` keyword arguments."""
    overrides: dict[str, Any] = {}
    modules = [part.strip() for value in args.tool_modules for part in value.split(",") if part.strip()]
    if modules:
        overrides["tool_modules"] = tuple(modules)
    if args.config:
        overrides["config"] = os.path.abspath(args.config)
    if args.redis_url:
        overrides["redis"] = {"url": args.redis_url}
    return overrides


def _add_paths(paths: list[str]) -> None:
    missing = [path for path in paths if not os.path.isdir(path)]
    if missing:
        raise ConfigError([(f"--path {path}", "no such directory") for path in missing])
    for path in reversed(paths):
        sys.path.insert(0, os.path.abspath(path))


def _ready_settings(args: argparse.Namespace) -> tuple[Settings, str]:
    """Settings checked and tools loaded, and the host to bind; raises what stops the start."""
    _add_paths(args.path)
    settings = load_settings(**settings_overrides(args))
    host: str = args.host or settings.api.host
    if not args.stdio:
        check_exposure(host, settings.api.tokens, door="unstuck mcp")
    answer_within_s(settings.mcp)
    preflight(settings)
    return settings, host


def _mcp(args: argparse.Namespace) -> int:
    import anyio

    from workers.servers.mcp_startup_error import refuse_stdio
    from workers.servers.mcp_transports import serve_http, serve_stdio

    try:
        settings, host = _ready_settings(args)
    except (ConfigError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        if args.stdio:
            refuse_stdio(str(exc), sys.stdin, sys.stdout)
        return 2
    # stdout carries the protocol on stdio: every log line goes to stderr.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    if args.stdio:
        anyio.run(serve_stdio, settings)
    else:
        port = args.port or settings.api.mcp_port
        anyio.run(functools.partial(serve_http, settings, host=host, port=port))
    return 0
