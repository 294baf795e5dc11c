"""The operator's recovery procedure as commands: ``session list|show|kill`` and ``locks``.

``session list`` reads the run indexes (running runs, then recently ended ones), never a
scan of the keyspace; ``locks`` scans lane keys, as an operator command may.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from typing import Any

from workers.answering.service import Answers
from workers.core.models import SyntheticReason
from workers.core.run_health import RunStatus
from workers.errors import ConfigError, StoreError
from workers.runtime import now_ms, open_ledger, worker_id
from workers.settings import Settings, load_settings
from workers.store.cancel import CancelMarks
from workers.store.records import CallField
from workers.store.sessions import RunInfo, SessionStore
from workers.store.watchdog_liveness import WatchdogLiveness
from workers.watchdog.operator_view import iso, session_rows, watchdog_warning
from workers.watchdog.sweep import end_and_answer, stale_lanes

__all__ = ["register", "timeline"]


def register(subparsers: Any) -> None:
    """Add the ``session`` and ``locks`` sub-commands."""
    session = subparsers.add_parser("session", help="inspect and recover agent sessions")
    sub = session.add_subparsers(dest="session_command", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="running and recently ended runs, one per line")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.add_argument("--status", help="only this status or class (running, stuck, aborted, ...)")
    listing.set_defaults(func=_guarded(_list))
    show = sub.add_parser("show", help="a session's current or latest run: its calls as a timeline")
    show.add_argument("id", help="the session key")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=_guarded(_show))
    kill = sub.add_parser(
        "kill", help="answer pending calls `cancelled`, stop running tools, revoke their tasks, free the lane"
    )
    kill.add_argument("id", help="the session key")
    kill.add_argument(
        "--let-finish",
        action="store_true",
        help="let tools already running finish under their own limits (their results are kept as late)",
    )
    kill.set_defaults(func=_guarded(_kill))
    locks = subparsers.add_parser("locks", help="session lane locks; stale ones can be cleaned")
    locks.add_argument("--stale", action="store_true", help="only locks nobody should hold")
    locks.add_argument("--clean", action="store_true", help="release the stale locks")
    locks.set_defaults(func=_guarded(_locks))


def _guarded(command: Callable[[argparse.Namespace, Settings, SessionStore], int]) -> Callable[..., int]:
    def run(args: argparse.Namespace) -> int:
        try:
            settings = load_settings()
            return command(args, settings, SessionStore(open_ledger(settings)))
        except (ConfigError, StoreError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1

    return run


def _warn_about_watchdog(settings: Settings, store: SessionStore, now: int) -> None:
    warning = watchdog_warning(
        WatchdogLiveness(store.ledger).last(), now=now, interval_s=settings.watchdog.interval_s
    )
    if warning is not None:
        print(f"warning: {warning}", file=sys.stderr)


def _list(args: argparse.Namespace, settings: Settings, store: SessionStore) -> int:
    now = now_ms()
    _warn_about_watchdog(settings, store, now)
    rows = session_rows(store, now=now, stalled_after_ms=int(settings.watchdog.stalled_after_s * 1000))
    if args.status:
        rows = [r for r in rows if args.status in (r["status"], r["class"])]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'SESSION':<28} {'RUN':<16} {'AGENT':<10} {'STATUS':<10} {'CLASS':<13} AGE_S  IDLE_S  PENDING")
    for r in rows:
        print(
            f"{r['id']:<28} {r['run']:<16} {r['agent']:<10} {r['status']:<10} {r['class']:<13} "
            f"{r['age_s']:>5}  {r['last_progress_s_ago']:>6}  {r['pending_calls']:>7}"
        )
    return 0


def _digest(job_json: str) -> str:
    try:
        arguments = json.loads(job_json)["call"]["arguments"]
    except (ValueError, KeyError, TypeError):
        return "-"
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:12]


def timeline(store: SessionStore, info: RunInfo) -> list[dict[str, Any]]:
    """The run's calls in submission order: tool, arguments digest, outcome, reason, durations."""
    keys = store.ledger.keys(info.session_key, info.run_id)
    out = []
    for call_id in store.ledger.run_call_ids(keys):
        record = store.ledger.record(keys, call_id)
        if record is None:
            continue
        f = record.row
        submitted = f.integer(CallField.SUBMITTED_MS)
        started, finished = f.integer(CallField.STARTED_MS), f.integer(CallField.FINISHED_MS)
        outcome = record.state.value
        if record.result is not None:
            outcome = "error" if record.result.is_error else "ok"
        out.append(
            {
                "call_id": call_id,
                "tool": record.tool,
                "arguments": _digest(f.text(CallField.JOB)),
                "outcome": outcome,
                "reason": f.text(CallField.REASON),
                "writer": f.text(CallField.WRITER),
                "queued_ms": started - submitted if started else None,
                "ran_ms": finished - started if finished and started else None,
                "total_ms": finished - submitted if finished else None,
            }
        )
    return out


def _dur(ms: int | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.1f}s"


def _find(store: SessionStore, session_key: str) -> RunInfo | None:
    info = store.find_session(session_key)
    if info is None:
        print(f"error: no session {session_key!r} (not running and not recently ended)", file=sys.stderr)
    return info


def _show(args: argparse.Namespace, settings: Settings, store: SessionStore) -> int:
    _warn_about_watchdog(settings, store, now_ms())
    info = _find(store, args.id)
    if info is None:
        return 1
    calls = timeline(store, info)
    agent = {
        "last_heartbeat": iso(info.agent_beat_ms) if info.agent_beat_ms else None,
        "last_heartbeat_what": info.agent_beat_what or None,
        "idle_streams": info.stream_idles,
    }
    if args.json:
        run = {"session": info.session_key, "run": info.run_id, "status": info.status}
        print(json.dumps({**run, "agent": agent, "calls": calls}))
        return 0
    print(f"session {info.session_key}  run {info.run_id}  agent {info.agent_id}  status {info.status}")
    beat = f"{agent['last_heartbeat']} ({agent['last_heartbeat_what']})" if info.agent_beat_ms else "never"
    print(f"  agent heartbeat: {beat}  model streams gone idle: {info.stream_idles}")
    for c in calls:
        print(
            f"  {c['call_id']:<20} {c['tool']:<16} {c['arguments']:<20} {c['outcome']:<8} "
            f"{c['reason'] or '-':<18} queued={_dur(c['queued_ms'])} ran={_dur(c['ran_ms'])} "
            f"total={_dur(c['total_ms'])}"
        )
    return 0


def _kill(args: argparse.Namespace, settings: Settings, store: SessionStore) -> int:
    info = _find(store, args.id)
    if info is None:
        return 1
    from workers.celery_edge.app import create_app

    app = create_app(settings, role="client")
    if not args.let_finish:
        # Marked before they are answered: each running tool's worker sees the mark, sends
        # SIGTERM to its process groups and SIGKILL after limits.cancel_grace_s.
        keys = store.ledger.keys(info.session_key, info.run_id)
        CancelMarks(store.ledger).request(keys, store.ledger.run_call_ids(keys), now_ms=now_ms())
    answers = Answers(writer=f"{worker_id()}/cli", fallbacks=settings.tools.failure_rules().fallbacks)
    answered = end_and_answer(
        store,
        answers,
        info.session_key,
        info.run_id,
        status=RunStatus.ABORTED,
        reason=SyntheticReason.CANCELLED,
        detail=" by an operator (session kill)",
        now_ms=now_ms(),
        revoke=lambda ids: app.control.revoke(ids, terminate=False),
    )
    store.release_lane(info.session_key, info.run_id)
    stopping = "left running" if args.let_finish else "stopped"
    print(
        f"killed session {info.session_key} run {info.run_id}: {answered} pending call(s) cancelled, "
        f"running tools {stopping}"
    )
    return 0


def _locks(args: argparse.Namespace, settings: Settings, store: SessionStore) -> int:
    now = now_ms()
    stale = {(lane.session_key, lane.run_id): why for lane, why in stale_lanes(store, now)}
    lanes = [lane for lane in store.lanes() if not args.stale or (lane.session_key, lane.run_id) in stale]
    for lane in lanes:
        why = stale.get((lane.session_key, lane.run_id), "")
        print(
            f"{lane.session_key:<28} run={lane.run_id:<16} token={lane.token:<5} "
            f"held={(now - lane.since_ms) / 1000:.0f}s lease_left={(lane.lease_until_ms - now) / 1000:.0f}s"
            + (f"  STALE ({why})" if why else "")
        )
    if args.clean:
        released = sum(
            store.release_lane(lane.session_key, lane.run_id, lane.token)
            for lane in lanes
            if (lane.session_key, lane.run_id) in stale
        )
        print(f"released {released} stale lock(s)")
    return 0
