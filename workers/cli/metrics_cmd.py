"""``unstuck metrics --port N [--bind ADDR]``: serve the ledger's Prometheus metrics on /metrics.

The endpoint has no authentication, as usual for Prometheus exporters: it binds to
loopback unless told otherwise. See :mod:`workers.ops.metrics` for the metrics and their cost.
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from workers.errors import ConfigError, StoreError
from workers.ops.breaker import BreakerCollector
from workers.ops.metrics import LedgerCollector
from workers.runtime import open_ledger
from workers.settings import Settings, load_settings

__all__ = ["build_registry", "register", "serve"]

_EXIT_BAD_SETUP = 2


def register(subparsers: Any) -> None:
    """Add the ``metrics`` sub-command."""
    metrics = subparsers.add_parser(
        "metrics", help="serve Prometheus metrics computed from the ledger (calls, stuck work)"
    )
    metrics.add_argument("--port", type=int, required=True, help="TCP port of the /metrics endpoint")
    metrics.add_argument("--bind", default="127.0.0.1", help="address to bind (default: loopback only)")
    metrics.add_argument(
        "--max-keys", type=int, default=20_000, help="most ledger keys one scrape reads (default 20000)"
    )
    metrics.set_defaults(func=_metrics)


def build_registry(settings: Settings, *, max_keys: int = 20_000) -> CollectorRegistry:
    """A registry with the ledger collector (and the breakers' if any), on the configured Redis.

    Raises:
        StoreError: when no Redis URL is configured.
    """
    registry = CollectorRegistry()
    ledger = open_ledger(settings)
    registry.register(LedgerCollector(ledger, max_keys=max_keys))
    if settings.tools.breakers:
        registry.register(BreakerCollector(ledger, settings.tools.breakers))
    return registry


def serve(registry: CollectorRegistry, port: int, bind: str) -> tuple[WSGIServer, threading.Thread]:
    """Start the HTTP endpoint in a daemon thread; port 0 picks a free one (``server.server_port``)."""
    server, thread = start_http_server(port, addr=bind, registry=registry)
    return server, thread


def _metrics(args: argparse.Namespace) -> int:
    try:
        registry = build_registry(load_settings(), max_keys=args.max_keys)
        server, thread = serve(registry, args.port, args.bind)
    except (ConfigError, StoreError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return _EXIT_BAD_SETUP
    print(f"serving http://{args.bind}:{server.server_port}/metrics", flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        server.shutdown()
    return 0
