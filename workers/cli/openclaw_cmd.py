"""``unstuck openclaw sessions|abort|doctor``: OpenClaw's own sessions as unstuck guards them.

``sessions`` lists the sessions the plugin reported, with their open calls, ages and states;
``abort SESSION`` ends every open call of a session (an ``exec``'s process tree is killed on
this host; other calls' runs are aborted through the gateway when ``openclaw.cli`` is set);
``doctor CONFIG`` names each OpenClaw setting that leaves sessions exposed, with its fix.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from workers.config_file import read_config_file
from workers.core.openclaw_doctor import doctor_findings
from workers.errors import ConfigError, StoreError
from workers.runtime import now_ms, open_ledger
from workers.settings import Settings, load_settings
from workers.store.openclaw_calls import OpenClawCalls
from workers.watchdog.openclaw_sweep import OpenClawSweep, OpenClawSweepReport
from workers.watchdog.openclaw_view import openclaw_rows

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``openclaw`` sub-command group."""
    group = subparsers.add_parser("openclaw", help="OpenClaw's own sessions and calls (its unstuck plugin)")
    sub = group.add_subparsers(dest="openclaw_command", metavar="ACTION", required=True)
    sessions = sub.add_parser("sessions", help="sessions with their open calls, ages and states")
    sessions.add_argument("--json", action="store_true", help="print JSON")
    sessions.set_defaults(func=_sessions)
    abort = sub.add_parser("abort", help="end every open call of a session (never re-run)")
    abort.add_argument("session", help="OpenClaw's session key")
    abort.set_defaults(func=_abort)
    doctor = sub.add_parser("doctor", help="name the OpenClaw settings that leave sessions exposed")
    doctor.add_argument("config", help="OpenClaw's config file (JSON5), e.g. ~/.openclaw/openclaw.json")
    doctor.set_defaults(func=_doctor)


def _store(settings: Settings) -> OpenClawCalls:
    ledger = open_ledger(settings)
    return OpenClawCalls(ledger.client, prefix=ledger.prefix, ttl_s=ledger.ttl_s)


def _sessions(args: argparse.Namespace) -> int:
    try:
        settings = load_settings()
        rows = openclaw_rows(_store(settings), settings, now_ms())
    except (ConfigError, StoreError) as exc:
        print(f"unstuck openclaw sessions: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no OpenClaw session has reported a call")
    for row in rows:
        opened = len(row["open_calls"])
        print(f"{row['session_key']}  {row['state']}  idle {row['idle_s']:.0f}s  open calls {opened}")
        for call in row["open_calls"]:
            late = "  OVERDUE" if call["overdue"] else ""
            print(
                f"    {call['tool']} {call['call_id']}  {call['age_s']:.0f}s of {call['budget_s']:g}s{late}"
            )
    return 0


def _abort(args: argparse.Namespace) -> int:
    try:
        settings = load_settings()
        store = _store(settings)
        report = OpenClawSweepReport()
        sweep = OpenClawSweep(store, settings, alert=lambda event: print(json.dumps(event, sort_keys=True)))
        mine = [c for c in store.open_calls() if c.session_key == args.session]
        left = [c.call_id for c in mine if not sweep.end_call(c, now_ms(), report)]
    except (ConfigError, StoreError) as exc:
        print(f"unstuck openclaw abort: {exc}", file=sys.stderr)
        return 1
    print(f"{args.session}: {len(mine)} open call(s), {len(report.killed)} ended")
    if left:
        print(
            f"not ended (no marked process here, and no openclaw.cli for sessions.abort): {', '.join(left)}"
        )
        return 1
    return 0


def _doctor(args: argparse.Namespace) -> int:
    try:
        settings = load_settings()
        config = read_config_file(args.config)
    except (ConfigError, OSError, ValueError) as exc:
        print(f"unstuck openclaw doctor: {exc}", file=sys.stderr)
        return 2
    findings = doctor_findings(config, mcp_client_timeout_s=settings.mcp.client_timeout_s)
    for finding in findings:
        print(f"EXPOSED {finding.setting}: {finding.problem}\n    fix: {finding.fix}")
    if not findings:
        print("ok: no setting leaves OpenClaw's sessions exposed")
    return 1 if findings else 0
