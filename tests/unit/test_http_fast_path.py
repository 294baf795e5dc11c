"""Which requests the HTTP door's hot route takes: only those the FastAPI route would accept as is."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import pytest

from workers.servers.http_calls import CallsDoor
from workers.servers.http_fast_path import HotToolCalls

PATH = "/v1/sessions/s1/runs/r1/tool-calls"
BODY = json.dumps({"format": "anthropic", "message": {"role": "assistant", "content": []}}).encode()
JSON = [(b"content-type", b"application/json")]


def _scope(
    path: str = PATH, method: str = "POST", headers: list[tuple[bytes, bytes]] = JSON
) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "root_path": "", "headers": headers}


@pytest.fixture
def hot() -> HotToolCalls:
    return HotToolCalls(cast(CallsDoor, None), asyncio.Semaphore(1))  # parse never touches the door


def test_a_well_formed_request_is_taken_with_its_run_and_validated_body(hot: HotToolCalls) -> None:
    # Given a tool-calls POST whose body fits, with a charset on its content type
    scope = _scope(headers=[(b"content-type", b"Application/JSON; charset=utf-8")])

    # When it is parsed
    request = hot.parse(scope, BODY)

    # Then it is the route's request, defaults filled in as the model fills them
    assert request is not None
    assert (request.session_key, request.run_id) == ("s1", "r1")
    assert (request.body.agent_id, request.body.format) == ("main", "anthropic")


@pytest.mark.parametrize(
    ("scope", "body"),
    [
        (_scope(method="GET"), BODY),
        (_scope(path="/v1/sessions/s1/runs/r1/tool-calls/"), BODY),  # Starlette redirects it
        (_scope(path="/v1/sessions/a/b/runs/r1/tool-calls"), BODY),  # a decoded %2F: no route
        (_scope(path="/v1/sessions//runs/r1/tool-calls"), BODY),
        (_scope(path="/v1/sessions/s1/runs/r1/results"), BODY),
        ({**_scope(), "root_path": "/api"}, BODY),
        (_scope(headers=[]), BODY),  # FastAPI parses it, but it is rare: let the route do it
        (_scope(headers=[(b"content-type", b"text/plain")]), BODY),
        (_scope(headers=[(b"content-type", b"text/plain"), *JSON]), BODY),  # FastAPI reads the first
        (_scope(), b""),
        (_scope(), b"{not json"),
        (_scope(), json.dumps({"format": "bogus", "message": {}}).encode()),
        (_scope(), json.dumps({"agent_id": "", "message": {}}).encode()),
        (_scope(), json.dumps({"format": "neutral"}).encode()),  # no message
        (_scope(), json.dumps([1, 2]).encode()),
        (_scope(), b"[" * 100_000),  # too deep for json.loads: the route answers 400
    ],
)
def test_anything_else_goes_on_to_the_fastapi_route(
    hot: HotToolCalls, scope: dict[str, Any], body: bytes
) -> None:
    assert hot.parse(scope, body) is None
