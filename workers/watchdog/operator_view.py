"""What operators see of sessions: one row per run, and whether the watchdog keeps up.

Shared by ``unstuck session list`` and the HTTP API's ``GET /v1/sessions``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from workers.core.run_health import RunStatus, classify, last_activity_ms, watchdog_late
from workers.store.sessions import SessionStore
from workers.store.watchdog_liveness import SweepRecord
from workers.watchdog.sweep import run_view

__all__ = ["LIST_LIMIT", "iso", "session_rows", "watchdog_warning"]

LIST_LIMIT = 1000


def session_rows(store: SessionStore, *, now: int, stalled_after_ms: int) -> list[dict[str, Any]]:
    """One row per indexed run: running ones first, then recently ended ones."""
    pairs = [(s, r) for s, r, _ in store.running(LIST_LIMIT) + store.ended(LIST_LIMIT)]
    infos = store.runs(list(dict.fromkeys(pairs)))
    activity = store.activity([(i.session_key, i.run_id) for i in infos])
    rows = []
    for info in infos:
        calls = tuple(activity.get((info.session_key, info.run_id), ()))
        view = run_view(info, calls)
        running = info.status == RunStatus.RUNNING.value
        klass = classify(view, now_ms=now, stalled_after_ms=stalled_after_ms).value if running else "-"
        rows.append(
            {
                "id": info.session_key,
                "run": info.run_id,
                "agent": info.agent_id,
                "status": info.status,
                "class": klass,
                "sessionKey": info.session_key,
                "started_at": iso(info.started_ms),
                "last_activity": iso(last_activity_ms(view)),
                # Epoch ms, as OpenClaw's own `session list --json` spells it.
                "lastActivity": last_activity_ms(view),
                "age_s": round((now - info.started_ms) / 1000, 1),
                "last_progress_s_ago": round((now - last_activity_ms(view)) / 1000, 1),
                "pending_calls": sum(call.open for call in calls),
            }
        )
    return rows


def iso(ms: int) -> str:
    """Absolute UTC time in ISO 8601, to the second (jq's ``fromdateiso8601`` reads it)."""
    return datetime.fromtimestamp(ms // 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def watchdog_warning(record: SweepRecord | None, *, now: int, interval_s: float) -> str | None:
    """A sentence for the operator when no sweep completed lately, else None."""
    if record is None:
        return "no watchdog sweep has completed: is `unstuck watchdog` running (and beat)?"
    lag_ms = record.lag_ms(now)
    if not watchdog_late(lag_ms, interval_ms=int(interval_s * 1000)):
        return None
    return (
        f"the last watchdog sweep completed {lag_ms / 1000:.1f} s ago (interval {interval_s:g} s): "
        "is `unstuck watchdog` running (and beat)?"
    )
