"""Which unstuck session and run an MCP ``tools/call`` belongs to.

An MCP session is an unstuck session; its calls share a run until the client has been idle
for ``api.mcp_run_idle_s``. A client may name any of them in the request's ``_meta``:

============================ ===============================================================
``_meta`` key                meaning
============================ ===============================================================
``unstuck/session``          the session key (otherwise ``mcp:<Mcp-Session-Id>``; on stdio
                             ``mcp:stdio-<id>``, one per server process; with no session at
                             all, a 2026-07-28 sessionless request, ``mcp-call:<call id>``)
``unstuck/run``              the run id; a named run is the client's to manage (the door
                             never ends it), a newer run of the session supersedes it
``unstuck/agent``            the agent id (per-agent settings), ``main`` otherwise
``unstuck/call``             the call id (a resubmitted id never runs twice), otherwise new
============================ ===============================================================

Nothing here does I/O or reads the clock: :class:`RunTracker` takes ``now_ms`` and says which
runs the door must end.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "META_AGENT",
    "META_CALL",
    "META_RUN",
    "META_SESSION",
    "CallTarget",
    "RunTracker",
    "agent_of",
    "resolve_target",
]

META_SESSION: Final = "unstuck/session"
META_RUN: Final = "unstuck/run"
META_AGENT: Final = "unstuck/agent"
META_CALL: Final = "unstuck/call"

_MAX_KEY = 256


@dataclass(frozen=True)
class CallTarget:
    """Where one call goes: its session, run, agent and call id.

    ``ephemeral`` marks a sessionless call: its session and run exist for this call only.
    """

    session_key: str
    run_id: str
    agent_id: str
    call_id: str
    named_run: bool = False
    ephemeral: bool = False


def _named(meta: Mapping[str, Any], key: str) -> str | None:
    """A non-empty string value of ``meta[key]`` (cut to a sane length), else None."""
    value = meta.get(key)
    if isinstance(value, str) and value.strip():
        return value.strip()[:_MAX_KEY]
    return None


def agent_of(meta: Mapping[str, Any] | None) -> str:
    """The agent a request names in ``_meta`` (``unstuck/agent``), else ``main``."""
    return _named(meta or {}, META_AGENT) or "main"


def resolve_target(
    meta: Mapping[str, Any] | None,
    *,
    mcp_session_id: str | None,
    new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
) -> CallTarget:
    """The session, agent and call id of a call; ``run_id`` is empty unless ``_meta`` names it.

    Args:
        meta: the request's ``_meta`` (any keys; non-string values are ignored).
        mcp_session_id: the transport's session (Streamable HTTP ``Mcp-Session-Id``, or the
            stdio server's own id), None on a sessionless request.
        new_id: makes fresh ids (injected by tests).
    """
    meta = meta or {}
    call_id = _named(meta, META_CALL) or f"mcp-{new_id()}"
    session = _named(meta, META_SESSION)
    run = _named(meta, META_RUN)
    agent = agent_of(meta)
    if session is None and mcp_session_id:
        session = f"mcp:{mcp_session_id[:_MAX_KEY]}"
    if session is None:
        # No session at all: the call is its own session and run, so it can neither
        # supersede nor be superseded by another client's calls.
        return CallTarget(f"mcp-call:{call_id}", run or call_id, agent, call_id, run is not None, True)
    return CallTarget(session, run or "", agent, call_id, run is not None)


@dataclass
class _AutoRun:
    run_id: str
    agent_id: str
    started_ms: int
    last_ms: int
    beat_ms: int
    open_calls: int = 0


class RunTracker:
    """The door's own runs: one per MCP session, ended once the client is idle.

    ``begin`` is called when a call starts and ``finish`` when it is answered; between calls
    the door heartbeats the run (``due_beats``), since the client is expected back within
    ``idle_ms`` and the watchdog must not take a model thinking between calls for a stuck
    run. A run that ended under the door (loop abort, operator, watchdog) is ``forget``-ed,
    so the session's next call starts a new one. A session's
    run rolls over to a new one when the client has been idle for ``idle_ms``, or when the
    run is older than ``max_age_ms`` (half its run timeout, so late calls are not cut short
    by the run's deadline) and no call is open. Named runs are not tracked; one supersedes
    the session's run, so the session's next unnamed call starts a new run (which supersedes
    the named one in turn: the newest run of a session always holds its lane).
    """

    def __init__(self, idle_ms: int, *, new_id: Callable[[], str] = lambda: uuid.uuid4().hex[:16]) -> None:
        self.idle_ms = idle_ms
        self._new_id = new_id
        self._runs: dict[str, _AutoRun] = {}

    def begin(
        self, session_key: str, *, agent_id: str = "main", now_ms: int, max_age_ms: int
    ) -> tuple[str, str | None]:
        """The run a new call of ``session_key`` joins, and the run it replaces (to end), if any."""
        run = self._runs.get(session_key)
        replaced = None
        if run is not None and run.open_calls == 0 and self._expired(run, now_ms, max_age_ms):
            replaced = run.run_id
            run = None
        if run is None:
            run = _AutoRun(
                f"mcp-{self._new_id()}", agent_id, started_ms=now_ms, last_ms=now_ms, beat_ms=now_ms
            )
            self._runs[session_key] = run
        run.open_calls += 1
        run.last_ms = now_ms
        return run.run_id, replaced

    def finish(self, session_key: str, run_id: str, *, now_ms: int) -> None:
        """A call of the run was answered (or cancelled)."""
        run = self._runs.get(session_key)
        if run is not None and run.run_id == run_id:
            run.open_calls = max(0, run.open_calls - 1)
            run.last_ms = now_ms

    def idle(self, now_ms: int) -> list[tuple[str, str]]:
        """Forget and return the (session, run) pairs whose client has been idle too long."""
        done = [
            (key, run.run_id)
            for key, run in self._runs.items()
            if run.open_calls == 0 and now_ms - run.last_ms >= self.idle_ms
        ]
        for key, _ in done:
            del self._runs[key]
        return done

    def forget(self, session_key: str, run_id: str | None = None) -> None:
        """The session's run (``run_id``, if given) no longer holds its lane: the next call starts one.

        Used when a named run took the lane and when the run ended under the door.
        """
        run = self._runs.get(session_key)
        if run is not None and run_id in (None, run.run_id):
            del self._runs[session_key]

    def due_beats(self, now_ms: int, every_ms: int) -> list[tuple[str, str, str]]:
        """(session, run, agent) of the runs with no call open and no beat for ``every_ms``.

        While a call is open the gateway's own waiting keeps the run visibly active.
        """
        due = [
            (key, run)
            for key, run in self._runs.items()
            if run.open_calls == 0 and now_ms - run.beat_ms >= every_ms
        ]
        for _, run in due:
            run.beat_ms = now_ms
        return [(key, run.run_id, run.agent_id) for key, run in due]

    def drain(self) -> list[tuple[str, str]]:
        """Forget and return every tracked run (the door is shutting down)."""
        done = [(key, run.run_id) for key, run in self._runs.items()]
        self._runs.clear()
        return done

    def _expired(self, run: _AutoRun, now_ms: int, max_age_ms: int) -> bool:
        return now_ms - run.last_ms >= self.idle_ms or now_ms - run.started_ms >= max_age_ms
