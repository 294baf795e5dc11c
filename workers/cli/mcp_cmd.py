"""``unstuck mcp``: the registered tools for any MCP host (Streamable HTTP, or ``--stdio``)."""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from typing import Any

from workers.doors.auth import check_exposure
from workers.errors import ConfigError, StoreError
from workers.launch import preflight
from workers.settings import load_settings

__all__ = ["register"]


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
    mcp.set_defaults(func=_mcp)


def _mcp(args: argparse.Namespace) -> int:
    import anyio

    from workers.doors.mcp_serving import serve_http, serve_stdio

    try:
        settings = load_settings()
        host = args.host or settings.api.host
        if not args.stdio:
            check_exposure(host, settings.api.tokens, door="unstuck mcp")
        preflight(settings)
    except (ConfigError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # stdout carries the protocol on stdio: every log line goes to stderr.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    if args.stdio:
        anyio.run(serve_stdio, settings)
    else:
        port = args.port or settings.api.mcp_port
        anyio.run(functools.partial(serve_http, settings, host=host, port=port))
    return 0
