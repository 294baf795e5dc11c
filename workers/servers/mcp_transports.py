"""How ``unstuck mcp`` is reached: Streamable HTTP (bearer tokens, loopback without) or stdio."""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from typing import Final

import anyio
import uvicorn
from mcp.server.stdio import stdio_server
from pydantic import SecretStr
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from workers.servers.auth import bearer_ok, check_exposure
from workers.servers.mcp_server import McpDoor
from workers.settings import Settings

__all__ = ["MCP_PATH", "BearerGate", "HangUpWatch", "http_app", "request_ids", "serve_http", "serve_stdio"]

MCP_PATH: Final = "/mcp"


class BearerGate:
    """ASGI middleware: HTTP requests without one of ``tokens`` get 401 (none configured: all pass)."""

    def __init__(self, app: ASGIApp, tokens: tuple[SecretStr, ...]) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the ``Authorization`` header of each HTTP request, then pass it on."""
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            authorization = headers.get(b"authorization", b"").decode("latin-1") or None
            if not bearer_ok(authorization, self.tokens):
                refusal = JSONResponse(
                    {"error": {"type": "unauthorized", "message": "a valid bearer token is required"}},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


class HangUpWatch:
    """ASGI middleware: tells the door when a client hangs up on a POST before its answer.

    The SDK ends the response stream then, but keeps serving the request (for a resumption
    this door does not offer): :meth:`McpDoor.client_left` cancels the requests of that body.
    """

    def __init__(self, app: ASGIApp, door: McpDoor) -> None:
        self.app = app
        self.door = door

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Watch one POST's body, answer and disconnect; pass everything else through."""
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        body: list[bytes] = []
        answered = False

        async def watched_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                body.append(message.get("body", b""))
            elif message["type"] == "http.disconnect" and not answered:
                session_id = dict(scope.get("headers") or []).get(b"mcp-session-id", b"").decode("latin-1")
                if session_id:
                    self.door.client_left(session_id, request_ids(b"".join(body)))
            return message

        async def watched_send(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True
            await send(message)

        await self.app(scope, watched_receive, watched_send)


def request_ids(body: bytes) -> list[str]:
    """The ids of the ``tools/call`` requests in a JSON-RPC body (one message or a batch)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return []
    messages = parsed if isinstance(parsed, list) else [parsed]
    return [
        str(message["id"])
        for message in messages
        if isinstance(message, dict) and message.get("method") == "tools/call" and "id" in message
    ]


def http_app(door: McpDoor, host: str) -> ASGIApp:
    """The Streamable HTTP app at :data:`MCP_PATH`, behind the bearer gate."""
    api = door.settings.api
    app = door.server().streamable_http_app(
        streamable_http_path=MCP_PATH, host=host, max_request_body_size=api.max_body_bytes
    )
    return BearerGate(HangUpWatch(app, door), api.tokens)


async def _announce(server: uvicorn.Server, url: str) -> None:
    while not server.started:  # noqa: ASYNC110 - uvicorn offers a flag, not an event
        await anyio.sleep(0.05)
    print(f"unstuck mcp: Streamable HTTP on {url}", file=sys.stderr, flush=True)


async def serve_http(settings: Settings, *, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM; then end the door's runs.

    Raises:
        ConfigError: a non-loopback ``host`` without ``api.tokens``.
    """
    check_exposure(host, settings.api.tokens, door="unstuck mcp")
    door = McpDoor.from_settings(settings)
    config = uvicorn.Config(http_app(door, host), host=host, port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(door.sweep_idle_runs)
            tasks.start_soon(door.tasks.serve)
            tasks.start_soon(_announce, server, f"http://{shown}:{port}{MCP_PATH}")
            await server.serve()
            tasks.cancel_scope.cancel()
    finally:
        await door.aclose()


_SIGNAL_ANSWER_S: Final = 5.0  # how long a signalled stdio door waits for its cancel answers


async def _exit_on_signal(door: McpDoor, scope: anyio.CancelScope) -> None:
    """At SIGTERM or SIGHUP: answer the open calls ``cancelled``, end the runs, exit.

    A host stopping its stdio servers signals them rather than closing stdin first. The
    door then exits with ``os._exit``: the SDK's stdin reader sits in a thread that only a
    closed stdin would end.
    """
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
        async for _ in signals:
            scope.cancel()
            with anyio.CancelScope(shield=True), anyio.move_on_after(_SIGNAL_ANSWER_S):
                while door.open_calls:  # noqa: ASYNC110 - a counter: calls end one by one
                    await anyio.sleep(0.02)
                await door.aclose()
            sys.stderr.flush()
            os._exit(0)


async def serve_stdio(settings: Settings) -> None:
    """Serve one client on stdin/stdout until it closes them (or a SIGTERM); one session."""
    door = McpDoor.from_settings(settings, stdio_session=f"stdio-{uuid.uuid4().hex[:16]}")
    server = door.server()
    print("unstuck mcp: stdio", file=sys.stderr, flush=True)
    try:
        async with stdio_server() as (read, write), anyio.create_task_group() as tasks:
            tasks.start_soon(door.sweep_idle_runs)
            tasks.start_soon(door.tasks.serve)
            tasks.start_soon(_exit_on_signal, door, tasks.cancel_scope)
            await server.run(read, write, server.create_initialization_options())
            tasks.cancel_scope.cancel()
    finally:
        await door.aclose()
