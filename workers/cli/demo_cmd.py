"""``unstuck demo``: a scripted agent session whose tools misbehave in every way.

The demo (:mod:`workers.local.demo`) plays the agent loop, so it needs a gateway; it gets
:class:`~workers.gateway.client.ToolGateway` from here, which keeps ``workers.local`` and
``workers.gateway`` independent. ``python -m workers.cli.demo_cmd gateway-child ...`` is the
gateway process the demo SIGKILLs mid-call (R3).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register"]

_GATEWAY_CHILD = "gateway-child"


def register(subparsers: Any) -> None:
    """Add the ``demo`` sub-command."""
    parser = subparsers.add_parser("demo", help="run a scripted session whose tools misbehave in every way")
    parser.add_argument("--json", action="store_true", help="print the calls and the invariant as JSON")
    parser.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from workers.gateway.client import ToolGateway
    from workers.local.demo import GatewaySide, run_demo

    child_argv = (sys.executable, "-m", "workers.cli.demo_cmd", _GATEWAY_CHILD)
    return run_demo(json_output=args.json, gateway=GatewaySide(make=ToolGateway, child_argv=child_argv))


def _gateway_child(argv: list[str]) -> int:
    """R3's doomed gateway: submit one call and wait for it (killed before it returns)."""
    from workers.core.models import ToolCall
    from workers.gateway.client import ToolGateway

    session_key, run_id, call_json = argv
    gateway = ToolGateway()
    gateway.call_tools(
        session_key=session_key, run_id=run_id, calls=[ToolCall.model_validate_json(call_json)]
    )
    return 0


if __name__ == "__main__" and sys.argv[1:2] == [_GATEWAY_CHILD]:
    sys.exit(_gateway_child(sys.argv[2:]))
