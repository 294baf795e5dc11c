"""The HTTP door's routes for the OpenClaw plugin (``integrations/openclaw``).

::

    POST /v1/openclaw/calls       {session_key, run_id, agent_id, call_id, tool, params}
         -> 200 {"block": bool, "message": str|null, "warning": str|null, "deadline_ms": int}
    POST /v1/openclaw/calls/end   {session_key, call_id, is_error, text, running}
         -> 200 {"ended": bool, "abort": str|null}
    POST /v1/openclaw/model-calls {session_key, run_id, started}      -> 200 {"ok": true}
    GET  /v1/openclaw/sessions    what ``unstuck openclaw sessions --json`` prints
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from workers.gateway.openclaw_guard import OpenClawGuard
from workers.runtime import now_ms, open_ledger
from workers.settings import Settings
from workers.watchdog.openclaw_view import openclaw_rows

__all__ = ["openclaw_routes"]


class CallStartBody(BaseModel):
    """An OpenClaw tool call about to run."""

    session_key: str = Field(min_length=1, max_length=256)
    run_id: str = Field(min_length=1, max_length=256)
    agent_id: str = Field("main", min_length=1, max_length=200)
    call_id: str = Field(min_length=1, max_length=256)
    tool: str = Field(min_length=1, max_length=256)
    params: dict[str, Any] = Field(default_factory=dict)


class CallEndBody(BaseModel):
    """An OpenClaw tool call that ended, with the text its result starts with."""

    session_key: str = Field(min_length=1, max_length=256)
    run_id: str = Field("", max_length=256)
    call_id: str = Field(min_length=1, max_length=256)
    tool: str = Field("", max_length=256)
    is_error: bool = False
    running: bool = False
    text: str = Field("", max_length=65536)


class ModelCallBody(BaseModel):
    """A model call of an OpenClaw run started or ended (the tier-2 scan's activity)."""

    session_key: str = Field(min_length=1, max_length=256)
    run_id: str = Field(min_length=1, max_length=256)
    started: bool


def openclaw_routes(api: FastAPI, settings: Settings, blocking: Callable[..., Awaitable[Any]]) -> None:
    """Add the plugin's routes to ``api``."""
    guard = OpenClawGuard(settings, open_ledger(settings))

    @api.post("/v1/openclaw/calls")
    async def call_start(body: CallStartBody) -> dict[str, Any]:
        """Record an OpenClaw call's start; the loop detector's verdict on it."""
        verdict: dict[str, Any] = await blocking(
            guard.start,
            body.session_key,
            body.run_id,
            body.agent_id,
            body.tool,
            body.call_id,
            body.params,
            now_ms(),
        )
        return verdict

    @api.post("/v1/openclaw/calls/end")
    async def call_end(body: CallEndBody) -> dict[str, Any]:
        """Record an OpenClaw call's end and its outcome for the loop detector."""
        ended: dict[str, Any] = await blocking(
            guard.end,
            body.session_key,
            body.call_id,
            is_error=body.is_error,
            text=body.text,
            running=body.running,
            now_ms=now_ms(),
        )
        return ended

    @api.post("/v1/openclaw/model-calls")
    async def model_call(body: ModelCallBody) -> dict[str, Any]:
        """Note a model call's start or end: a start with no end is a stream in flight."""
        await blocking(
            guard.calls.model_call, body.session_key, body.run_id, started=body.started, now_ms=now_ms()
        )
        return {"ok": True}

    @api.get("/v1/openclaw/sessions")
    async def sessions() -> list[dict[str, Any]]:
        """OpenClaw's sessions with their open calls, ages and states."""
        rows: list[dict[str, Any]] = await blocking(openclaw_rows, guard.calls, settings, now_ms())
        return rows
