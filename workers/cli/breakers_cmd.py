"""``unstuck breakers``: the shared circuit breakers of the tools named in ``tools.breakers``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from workers.errors import ConfigError, StoreError
from workers.runtime import now_ms, open_ledger
from workers.settings import load_settings
from workers.store.breaker import BreakerStore

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``breakers`` sub-command."""
    breakers = subparsers.add_parser("breakers", help="state of the tools' shared circuit breakers")
    breakers.add_argument("--json", action="store_true", help="print JSON")
    breakers.set_defaults(func=_breakers)


def _breakers(args: argparse.Namespace) -> int:
    try:
        settings = load_settings()
        policies = settings.tools.breakers
        rows = BreakerStore(open_ledger(settings)).overview(policies, now_ms=now_ms()) if policies else []
    except (ConfigError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no breakers configured (set tools.breakers.<tool>)")
        return 0
    print(f"{'TOOL':<24} {'STATE':<10} {'FAILURES':>10} {'WINDOW_S':>9} {'PROBES':>7} RETRY_AFTER_S")
    for r in rows:
        failures = f"{r['recent_failures']}/{r['failures_to_open']}"
        print(
            f"{r['tool']!s:<24} {r['state']!s:<10} {failures:>10} {r['window_s']!s:>9} "
            f"{r['probes']!s:>7} {r['retry_after_s']}"
        )
    return 0
