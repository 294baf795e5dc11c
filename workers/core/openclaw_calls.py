"""OpenClaw's own tool calls as unstuck sees them: budgets, states, what is overdue or silent.

OpenClaw runs its built-in tools itself (``exec``, browser, ``web_fetch``, file tools); its
plugin (``integrations/openclaw``) reports each call's start and end to unstuck's HTTP door.
unstuck cannot answer such a call itself: past its budget the watchdog ends the ``exec``
process tree or aborts the run, and OpenClaw's own abort path writes the one result.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "CALL_ID_ENV",
    "OpenClawCall",
    "OpenClawCallState",
    "overdue",
    "overdue_note",
    "silent_sessions",
    "stuck_note",
]

#: The env marker the plugin adds to every ``exec`` command: its process tree carries it.
CALL_ID_ENV = "UNSTUCK_CALL_ID"


class OpenClawCallState(enum.StrEnum):
    """Where an OpenClaw call is; every state but ``open`` is final (first writer wins)."""

    OPEN = "open"
    DONE = "done"
    FAILED = "failed"
    BLOCKED = "blocked"
    KILLED = "killed"
    ABORTED = "aborted"


@dataclass(frozen=True)
class OpenClawCall:
    """One OpenClaw tool call as its plugin reported it."""

    session_key: str
    run_id: str
    agent_id: str
    tool: str
    call_id: str
    started_ms: int
    deadline_ms: int
    state: OpenClawCallState = OpenClawCallState.OPEN
    ended_ms: int | None = None

    @property
    def budget_s(self) -> float:
        """The budget it was given, seconds."""
        return (self.deadline_ms - self.started_ms) / 1000

    def age_s(self, now_ms: int) -> float:
        """Seconds it has run (until its end, once ended)."""
        end = self.ended_ms if self.ended_ms is not None else now_ms
        return max(0, end - self.started_ms) / 1000


def overdue(calls: Iterable[OpenClawCall], now_ms: int) -> list[OpenClawCall]:
    """The open calls past their deadline, oldest deadline first."""
    late = [c for c in calls if c.state is OpenClawCallState.OPEN and c.deadline_ms <= now_ms]
    return sorted(late, key=lambda c: c.deadline_ms)


def overdue_note(call: OpenClawCall, how: OpenClawCallState) -> str:
    """What the session is told after unstuck ended a call, so its model can go on."""
    done = "its process tree was killed" if how is OpenClawCallState.KILLED else "its run was aborted"
    return (
        f"[unstuck] The {call.tool} call {call.call_id} ran past its budget of {call.budget_s:g} s "
        f"and was stopped: {done}. It was not retried; its side effects may be partial. "
        "Check the state before you run it again, with a timeout."
    )


def silent_sessions(
    last_activity_ms: dict[str, int], open_sessions: set[str], now_ms: int, stuck_after_s: float
) -> list[tuple[str, float]]:
    """Sessions with a call open and no activity for longer than ``stuck_after_s``: (session, silent s)."""
    out = []
    for session in sorted(open_sessions):
        silent_s = (now_ms - last_activity_ms.get(session, now_ms)) / 1000
        if silent_s > stuck_after_s:
            out.append((session, silent_s))
    return out


def stuck_note(session_key: str, silent_s: float, *, recover: bool) -> str:
    """What a channel alert says about a session the tier-2 scan found stuck."""
    then = "unstuck is recovering it (its run aborted)." if recover else "Nobody has ended it yet."
    return (
        f"[unstuck] OpenClaw session {session_key} has had a call or a model stream open with no "
        f"activity for {silent_s:.0f} s. {then}"
    )
