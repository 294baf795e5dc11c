"""The hot route of ``unstuck serve``, ``POST …/tool-calls``, answered without FastAPI's request work.

Every agent turn posts here, so its cost is what the door adds to each tool call (target:
at most 1 ms over the Python gateway). FastAPI matches routes, solves dependencies and wraps
``send`` in several middlewares for every request (its cost: docs/performance.md). The
guard hands this module a request that is plainly well formed (the route's method and path,
a JSON content type, a body that parses and fits ``ToolCallsBody``) and it answers it
directly; anything else, every malformed request included, goes on to the FastAPI route,
which answers it with its own errors. The contract (and each error body) keeps one definition, the
route's: this is only a shorter way to the same answer.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from starlette.types import Receive, Scope, Send

from workers.errors import UnstuckError
from workers.servers.http_calls import CallsDoor
from workers.servers.http_schema import ToolCallsBody, answer_response, error_response

__all__ = ["HotRequest", "HotToolCalls"]


@dataclass(frozen=True)
class HotRequest:
    """A well-formed tool-calls request."""

    session_key: str
    run_id: str
    body: ToolCallsBody


class HotToolCalls:
    """Recognises and answers well-formed tool-calls requests (see the module docstring)."""

    def __init__(self, calls: CallsDoor, waiting: asyncio.Semaphore) -> None:
        self._calls = calls
        self._waiting = waiting  # shared with the FastAPI routes that wait

    def parse(self, scope: Scope, body: bytes) -> HotRequest | None:
        """The request when it is a well-formed tool-calls POST; None: the FastAPI route answers."""
        run = _run_of(scope)
        if run is None or not _is_json(scope):
            return None
        try:
            # As Starlette's ``Request.json`` (FastAPI then validates the object): same values.
            return HotRequest(*run, ToolCallsBody.model_validate(json.loads(body)))
        except (ValueError, RecursionError):  # ValidationError is a ValueError
            return None

    async def answer(self, request: HotRequest, scope: Scope, receive: Receive, send: Send) -> None:
        """What the FastAPI route answers: the calls' answer, or 422 for a refused message."""
        body = request.body
        try:
            async with self._waiting:
                answer = await self._calls.arun(
                    request.session_key, request.run_id, body.agent_id, body.format, body.message
                )
        except UnstuckError as exc:  # as the app's exception handler
            await error_response(422, type(exc).__name__, str(exc))(scope, receive, send)
            return
        await answer_response(answer)(scope, receive, send)


def _run_of(scope: Scope) -> tuple[str, str] | None:
    """Session and run of ``/v1/sessions/{session}/runs/{run}/tool-calls`` (as Starlette matches it)."""
    if scope["method"] != "POST" or scope.get("root_path"):
        return None
    parts = scope["path"].split("/")
    if len(parts) != 7 or parts[:3] != ["", "v1", "sessions"] or parts[4] != "runs":
        return None
    if parts[6] != "tool-calls" or not parts[3] or not parts[5]:
        return None
    return parts[3], parts[5]


def _is_json(scope: Scope) -> bool:
    """Whether the first Content-Type header is ``application/json`` (FastAPI reads its first)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            return bool(value.split(b";", 1)[0].strip().lower() == b"application/json")
    return False
