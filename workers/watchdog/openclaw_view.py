"""What ``unstuck openclaw sessions`` shows: OpenClaw's sessions with their open calls."""

from __future__ import annotations

from typing import Any

from workers.core.openclaw_calls import silent_sessions
from workers.settings import Settings
from workers.store.openclaw_calls import OpenClawCalls

__all__ = ["openclaw_rows"]


def openclaw_rows(calls: OpenClawCalls, settings: Settings, now_ms: int) -> list[dict[str, Any]]:
    """One row per session that reported activity: its open calls, their ages, and its state."""
    activity = calls.activity()
    open_calls = calls.open_calls()
    by_session: dict[str, list[dict[str, Any]]] = {}
    for call in open_calls:
        by_session.setdefault(call.session_key, []).append(
            {
                "call_id": call.call_id,
                "run_id": call.run_id,
                "tool": call.tool,
                "age_s": round(call.age_s(now_ms), 1),
                "budget_s": call.budget_s,
                "overdue": call.deadline_ms <= now_ms,
            }
        )
    stuck = dict(silent_sessions(activity, set(by_session), now_ms, settings.openclaw.stuck_after_s))
    rows = []
    for session, last_ms in sorted(activity.items(), key=lambda kv: -kv[1]):
        open_here = by_session.get(session, [])
        state = (
            "stuck"
            if session in stuck
            else "overdue"
            if any(c["overdue"] for c in open_here)
            else ("running" if open_here else "idle")
        )
        rows.append(
            {
                "session_key": session,
                "state": state,
                "idle_s": round((now_ms - last_ms) / 1000, 1),
                "open_calls": open_here,
            }
        )
    return rows
