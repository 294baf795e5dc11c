"""``unstuck serve``: the HTTP/JSON API for agent loops in any language (see workers.servers.http_api)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from workers.errors import ConfigError, StoreError

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``serve`` sub-command."""
    serve = subparsers.add_parser("serve", help="serve the HTTP API (OpenAPI at /openapi.json)")
    serve.add_argument("--host", help="address to bind (default: api.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default: api.port, 8765)")
    serve.add_argument("-l", "--loglevel", default="info")
    serve.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from workers.cli.launch import preflight
    from workers.servers.auth import check_exposure
    from workers.servers.http_api import create_api
    from workers.settings import load_settings

    try:
        settings = load_settings()
        host = args.host or settings.api.host
        check_exposure(host, settings.api.tokens, door="unstuck serve")
        preflight(settings)
    except (ConfigError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    port = args.port or settings.api.port
    uvicorn.run(create_api(settings), host=host, port=port, log_level=args.loglevel.lower())
    return 0
