"""The watchdog's guard over OpenClaw's own calls and sessions (reported by its plugin).

* A call past its budget (``openclaw.budgets_s``): an ``exec`` has its process tree killed —
  found by the ``UNSTUCK_CALL_ID`` marker the plugin put in its environment — so OpenClaw's
  own exec path writes the call's one result (the command's exit) and the model goes on.
  Another tool's run is aborted through the gateway (``sessions.abort``, when ``openclaw.cli``
  is set; OpenClaw's transcript repair writes the result); else it is alerted
  (``openclaw_call_overdue``). Then the session is told (``sessions.send``). Never re-run.
* The tier-2 scan: a session with a call open and no reported activity for longer than
  ``openclaw.stuck_after_s`` is alerted (``openclaw_session_stuck``): log, events stream,
  webhook (``alerts.webhook_url``).
* Tombstones: every ``openclaw.tombstone_scan_interval_s`` the gateway's ``sessions.list`` is
  read; a session its restart recovery tombstoned is alerted once
  (``openclaw_session_tombstoned``), and counted in the metrics while it stays so.

Stuck and tombstoned sessions are also sent to ``openclaw.alert_target`` through OpenClaw's
own channels (gateway ``send``), when set: they wait for a person.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from workers.core.openclaw_calls import (
    CALL_ID_ENV,
    OpenClawCall,
    OpenClawCallState,
    overdue_note,
    silent_sessions,
    stuck_note,
)
from workers.core.openclaw_tombstones import complete, tombstone_changes, tombstone_note, tombstones
from workers.settings import Settings
from workers.store.openclaw_calls import OpenClawCalls
from workers.watchdog.openclaw_rpc import GatewayRpc

__all__ = ["OpenClawSweep", "OpenClawSweepReport", "kill_marked_tree", "marked_processes"]

log = logging.getLogger(__name__)


@dataclass
class OpenClawSweepReport:
    """What one sweep did."""

    killed: list[str] = field(default_factory=list)
    overdue: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    tombstoned: list[str] = field(default_factory=list)


def marked_processes(call_id: str) -> list[psutil.Process]:
    """Every process whose environment says it runs ``call_id`` (its exec's whole tree)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(CALL_ID_ENV) == call_id:
                found.append(proc)
        except psutil.Error:  # gone, or not ours to read
            continue
    return found


def kill_marked_tree(call_id: str) -> int:
    """SIGKILL the call's marked processes and their children; how many were signalled."""
    targets: dict[int, psutil.Process] = {}
    for proc in marked_processes(call_id):
        targets[proc.pid] = proc
        try:
            for child in proc.children(recursive=True):  # a child may have dropped the env
                targets[child.pid] = child
        except psutil.Error:
            continue
    for proc in targets.values():
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            continue
    return len(targets)


class OpenClawSweep:
    """One watchdog's guard over the OpenClaw calls in the store."""

    def __init__(
        self,
        calls: OpenClawCalls,
        settings: Settings,
        *,
        alert: Callable[[dict[str, Any]], None],
        kill: Callable[[str], int] = kill_marked_tree,
        rpc: GatewayRpc | None = None,
    ) -> None:
        self._calls = calls
        self._rpc = rpc or GatewayRpc(settings)
        self._settings = settings
        self._alert = alert
        self._kill = kill
        self._alerted: set[str] = set()  # overdue calls already alerted (not ended by us)
        self._stuck_alerted: dict[str, int | None] = {}  # session -> its activity when alerted
        self._tombstones_due_ms = 0  # when sessions.list is read next

    def sweep(self, now_ms: int) -> OpenClawSweepReport:
        """End or alert every overdue call, then alert the silent sessions."""
        report = OpenClawSweepReport()
        for call in self._calls.due(now_ms):
            self._overdue(call, now_ms, report)
        self._scan(now_ms, report)
        self._tombstones(now_ms, report)
        return report

    def _tombstones(self, now_ms: int, report: OpenClawSweepReport) -> None:
        """Alert each session OpenClaw's restart recovery tombstoned, once (the store decides)."""
        if not self._rpc.configured or now_ms < self._tombstones_due_ms:
            return
        self._tombstones_due_ms = now_ms + int(self._settings.openclaw.tombstone_scan_interval_s * 1000)
        answer = self._rpc.sessions()
        if answer is None:  # the gateway did not answer: nothing learnt, nothing forgotten
            return
        new, gone = tombstone_changes(tombstones(answer), self._calls.tombstones(), complete=complete(answer))
        for tombstone in self._calls.note_tombstones(new, gone):
            report.tombstoned.append(tombstone.session_key)
            note = tombstone_note(tombstone)
            self._alert(
                {
                    "kind": "openclaw_session_tombstoned",
                    "session_key": tombstone.session_key,
                    "session_id": tombstone.session_id,
                    "note": note,
                }
            )
            self._to_channel(note, f"unstuck-tombstone-{tombstone.session_key}-{tombstone.session_id}")

    def _to_channel(self, text: str, idempotency_key: str) -> None:
        """Send an alert through OpenClaw's own channels when ``openclaw.alert_target`` is set."""
        if not (self._rpc.configured and self._settings.openclaw.alert_target):
            return
        if not self._rpc.message(text, idempotency_key):
            log.warning("openclaw: could not send the alert to %s", self._settings.openclaw.alert_target)

    def _scan(self, now_ms: int, report: OpenClawSweepReport) -> None:
        """Tier 2: alert sessions silent with a call or a model stream open; recover them if asked."""
        open_calls = self._calls.open_calls()
        streams = self._calls.streams()
        busy = {c.session_key for c in open_calls} | {session for session, _, _ in streams}
        stuck_after_s = self._settings.openclaw.stuck_after_s
        activity = self._calls.activity()
        for session, silent_s in silent_sessions(activity, busy, now_ms, stuck_after_s):
            report.stuck.append(session)
            runs = sorted({run for s, run, _ in streams if s == session})
            if self._stuck_alerted.get(session) == activity.get(session):
                continue  # alerted already, and nothing happened since
            self._stuck_alerted[session] = activity.get(session)
            self._alert(
                {
                    "kind": "openclaw_session_stuck",
                    "session_key": session,
                    "silent_s": round(silent_s, 1),
                    "runs": runs,
                }
            )
            self._to_channel(
                stuck_note(session, silent_s, recover=self._settings.openclaw.recover),
                f"unstuck-stuck-{session}-{activity.get(session)}",
            )
            if self._settings.openclaw.recover:
                self._recover(
                    session, runs, [c for c in open_calls if c.session_key == session], now_ms, report
                )

    def _recover(
        self,
        session: str,
        runs: list[str],
        calls: list[OpenClawCall],
        now_ms: int,
        report: OpenClawSweepReport,
    ) -> None:
        for call in calls:
            self.end_call(call, now_ms, report)
        for run in runs:
            if self._rpc.abort(session, run):
                self._calls.model_call(session, run, started=False, now_ms=now_ms)
                self._alert({"kind": "openclaw_session_recovered", "session_key": session, "run_id": run})

    def _overdue(self, call: OpenClawCall, now_ms: int, report: OpenClawSweepReport) -> None:
        if self.end_call(call, now_ms, report):
            return
        report.overdue.append(call.call_id)
        if call.call_id not in self._alerted:
            self._alerted.add(call.call_id)
            self._alert(_fields("openclaw_call_overdue", call, now_ms, None))

    def end_call(self, call: OpenClawCall, now_ms: int, report: OpenClawSweepReport) -> bool:
        """Kill an exec's marked tree, else abort the run; False when neither was possible.

        Either way OpenClaw itself writes the call's one result (the command's exit, or its
        abort repair); unstuck never re-runs the call.
        """
        if call.tool == "exec":
            if self._kill(call.call_id) == 0:  # a background exec whose process ended by itself
                self._calls.end(call.session_key, call.call_id, OpenClawCallState.DONE, now_ms)
                return True
            how = OpenClawCallState.KILLED
        else:
            current = self._calls.get(call.session_key, call.call_id)
            if current is None or current.state is not OpenClawCallState.OPEN:
                return True  # it ended by itself since it was found: its run goes on, untouched
            if not self._rpc.abort(call.session_key, call.run_id):
                return False
            how = OpenClawCallState.ABORTED
        # unstuck stopped it, so unstuck says so, whoever records the end first: OpenClaw's own
        # report of it (the plugin's after_tool_call) often lands while the gateway RPC returns.
        self._calls.end(call.session_key, call.call_id, how, now_ms)
        report.killed.append(call.call_id)
        note = overdue_note(call, how)
        self._alert({**_fields(f"openclaw_call_{how.value}", call, now_ms, note), "ended_ms": now_ms})
        if self._rpc.configured and not self._rpc.tell(call.session_key, note):
            log.warning("openclaw: could not tell %s that %s was stopped", call.session_key, call.call_id)
        return True


def _fields(kind: str, call: OpenClawCall, now_ms: int, note: str | None) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "kind": kind,
        "session_key": call.session_key,
        "run_id": call.run_id,
        "call_id": call.call_id,
        "tool": call.tool,
        "age_s": round(call.age_s(now_ms), 1),
        "budget_s": call.budget_s,
    }
    if note is not None:
        fields["note"] = note
    return fields
