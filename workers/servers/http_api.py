"""``unstuck serve``: the HTTP/JSON door for agent loops in any language.

The contract (OpenAPI at ``/openapi.json``)::

    POST /v1/sessions/{session}/runs/{run}/tool-calls   {"agent_id", "format", "message"}
         -> 200 {"results": [neutral ToolResult...], "append": <in format>, "aborted": null|{...}}
    GET  /v1/sessions/{session}/runs/{run}/results?format=F      (collect: the same shape)
    POST /v1/sessions/{session}/runs/{run}/compaction | heartbeat | end
    POST /v1/sessions/{session}/runs/{run}/cancel       {"call_id"?}  -> 200 {"cancelled": n}
    GET  /v1/tools?format=F&agent_id=A   tool definitions for the model (A: only what A may call)
    POST /v1/repair                {"format", "transcript", "provider"?}
    GET  /v1/sessions              what ``unstuck session list --json`` prints
    GET  /healthz                  200 when Redis answers, 503 otherwise
    /v1/openclaw/...               the OpenClaw plugin's routes (workers.servers.http_openclaw)

Errors are ``{"error": {"type", "message"}}``: 400 malformed JSON, 422 a body that does not
fit the schema or an unknown format, 401 a missing or wrong bearer token, 413 a body over
``api.max_body_bytes``. A tool-calls request answers when every call has its one result, no
later than the latest deadline plus ``gateway.grace_s``; a client that disconnects loses
nothing (the calls finish in the ledger and ``results`` returns them later).

Tool-calls and results requests wait on the gateway's asyncio path: a waiting request holds
a Redis connection, not a thread (at most ``api.max_waiting`` wait at once; more queue). Short
store calls (heartbeat, end, sessions, ...) run on a small thread pool.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, TypeVar

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from workers import tracing
from workers.errors import UnstuckError
from workers.servers.auth import bearer_ok
from workers.servers.http_calls import CallsDoor
from workers.servers.http_fast_path import HotToolCalls
from workers.servers.http_openclaw import openclaw_routes
from workers.servers.http_schema import (
    CallsAnswer,
    CancelBody,
    CompactionBody,
    EndBody,
    Format,
    HeartbeatBody,
    RepairBody,
    ToolCallsBody,
    answer_response,
    error_response,
)
from workers.settings import Settings

__all__ = ["Format", "create_api"]

T = TypeVar("T")

_SHORT_CALL_THREADS = 16  # heartbeat, end, sessions, health: a few store round trips each


class _Guard:
    """Bearer tokens on /v1 and a cap on request bodies, before any route runs.

    Plain ASGI (Starlette's ``BaseHTTPMiddleware`` costs a task and a stream per request):
    the body is read here, counted, and handed to the route as one message, or, for a
    well-formed tool-calls request, answered by ``hot`` (:mod:`workers.servers.http_fast_path`).
    """

    def __init__(self, app: ASGIApp, settings: Settings, hot: HotToolCalls) -> None:
        self._app = app
        self._tokens = settings.api.tokens
        self._cap = settings.api.max_body_bytes
        self._hot = hot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = {name: value.decode("latin-1") for name, value in scope["headers"]}
        with tracing.joined_asgi(headers):  # the caller's traceparent/tracestate, if any
            await self._guarded(scope, receive, send, headers)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, headers: dict[bytes, str]) -> None:
        refusal = self._refusal(scope["path"], headers)
        if refusal is None:
            body, complete = await self._read_body(receive)
            if complete:
                hot = self._hot.parse(scope, body)
                if hot is not None:
                    await self._hot.answer(hot, scope, receive, send)
                    return
                await self._app(scope, _replay(body, receive), send)
                return
            refusal = error_response(413, "body_too_large", f"the body is over {self._cap} bytes")
        await refusal(scope, receive, send)

    def _refusal(self, path: str, headers: dict[bytes, str]) -> JSONResponse | None:
        if path.startswith("/v1") and not bearer_ok(headers.get(b"authorization"), self._tokens):
            return error_response(401, "unauthorized", "a valid bearer token is required")
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._cap:
            return error_response(413, "body_too_large", f"the body is over {self._cap} bytes")
        return None

    async def _read_body(self, receive: Receive) -> tuple[bytes, bool]:
        """The whole body, and False once it grew over the cap (the rest is not read)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks), True  # disconnected: the route sees an empty body
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._cap:
                return b"", False
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), True


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the body already read, then whatever the client sends next."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()  # e.g. http.disconnect
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


def create_api(settings: Settings, door: CallsDoor | None = None) -> FastAPI:
    """The ASGI app of ``unstuck serve`` (``door`` default: one on a fresh gateway)."""
    calls = door or CallsDoor(settings)
    pool = ThreadPoolExecutor(max_workers=_SHORT_CALL_THREADS, thread_name_prefix="unstuck-serve")
    waiting = asyncio.Semaphore(settings.api.max_waiting)
    api = FastAPI(
        title="unstuck",
        version="1",
        description="Every tool call gets exactly one result, on time, whatever breaks.",
    )
    api.add_middleware(_Guard, settings=settings, hot=HotToolCalls(calls, waiting))

    async def blocking(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(pool, functools.partial(function, *args, **kwargs))

    _errors(api)
    _routes(api, calls, blocking, waiting)
    openclaw_routes(api, settings, blocking)

    @api.on_event("shutdown")
    async def _close() -> None:  # pragma: no cover - exercised by process exit
        pool.shutdown(wait=False, cancel_futures=True)
        await calls.aclose()

    return api


def _errors(api: FastAPI) -> None:
    @api.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = exc.errors()
        if any(p.get("type") == "json_invalid" for p in problems):
            return error_response(400, "malformed_json", "the body is not valid JSON")
        text = "; ".join(
            f"{'.'.join(str(x) for x in p.get('loc', ()))}: {p.get('msg')}" for p in problems[:5]
        )
        return error_response(422, "invalid_request", text)

    @api.exception_handler(UnstuckError)
    async def refused(_request: Request, exc: UnstuckError) -> JSONResponse:
        return error_response(422, type(exc).__name__, str(exc))


def _routes(
    api: FastAPI, calls: CallsDoor, blocking: Callable[..., Awaitable[Any]], waiting: asyncio.Semaphore
) -> None:
    run_path = "/v1/sessions/{session_key}/runs/{run_id}"

    @api.post(f"{run_path}/tool-calls", response_model=CallsAnswer)
    async def tool_calls(session_key: str, run_id: str, body: ToolCallsBody) -> JSONResponse:
        """Run the message's tool calls; answers when each has its one result."""
        async with waiting:
            answer = await calls.arun(session_key, run_id, body.agent_id, body.format, body.message)
        return answer_response(answer)

    @api.get(f"{run_path}/results", response_model=CallsAnswer)
    async def results(session_key: str, run_id: str, format: Format = "neutral") -> JSONResponse:
        """Every call's result of the run (after a restart), waiting for live ones."""
        async with waiting:
            return answer_response(await calls.acollect(session_key, run_id, format))

    @api.post(f"{run_path}/compaction")
    async def compaction(session_key: str, run_id: str, body: CompactionBody) -> dict[str, Any]:
        """Arm the post-compaction loop guard."""
        return {"guard": await blocking(calls.gateway.note_compaction, session_key, run_id, body.agent_id)}

    @api.post(f"{run_path}/heartbeat")
    async def heartbeat(session_key: str, run_id: str, body: HeartbeatBody) -> dict[str, Any]:
        """The agent works on the run (its model thinks or streams)."""
        running = await blocking(
            calls.gateway.heartbeat, session_key, run_id, agent_id=body.agent_id, what=body.what
        )
        return {"running": running}

    @api.post(f"{run_path}/end")
    async def end(session_key: str, run_id: str, body: EndBody) -> dict[str, Any]:
        """End the run and free its session's lane."""
        return {"ended": await blocking(calls.gateway.end_run, session_key, run_id, body.status)}

    @api.post(f"{run_path}/cancel")
    async def cancel(session_key: str, run_id: str, body: CancelBody | None = None) -> dict[str, Any]:
        """Cancel a call (or every unanswered call) of the run; each is answered ``cancelled`` once."""
        call_id = body.call_id if body is not None else None
        return {"cancelled": await blocking(calls.gateway.cancel, session_key, run_id, call_id)}

    @api.get("/v1/tools")
    async def tools(
        format: Format = "neutral",
        agent_id: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
    ) -> list[Any]:
        """Tool definitions for the model, in ``format``; with ``agent_id``, only what it may call."""
        return calls.tool_definitions(format, agent_id)

    @api.post("/v1/repair")
    async def repair(body: RepairBody) -> dict[str, Any]:
        """A transcript repaired for its provider: every call paired with exactly one result."""
        return calls.repair(body.format, body.transcript, body.provider, body.model_api, body.model_id)

    @api.get("/v1/sessions")
    async def sessions() -> list[dict[str, Any]]:
        """Running and recently ended runs, one row each."""
        rows: list[dict[str, Any]] = await blocking(calls.sessions)
        return rows

    @api.get("/healthz")
    async def healthz() -> JSONResponse:
        """200 when Redis answers, 503 otherwise."""
        problem = await blocking(calls.store_problem)
        if problem is None:
            return JSONResponse({"ok": True})
        return JSONResponse({"ok": False, "redis": problem}, status_code=503)
