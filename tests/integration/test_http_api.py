"""``unstuck serve`` as a real process: the contract clients in any language are written against."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness import UNSTUCK, Proc, settings_of, wait_until
from workers.local.embedded_redis import free_port
from workers.runtime import open_ledger

pytestmark = pytest.mark.timeout(90)

TOKEN = "t0ken-for-tests"


@dataclass(frozen=True)
class Api:
    url: str

    def call(
        self, method: str, path: str, body: Any = None, *, token: str | None = TOKEN, raw: bytes | None = None
    ) -> tuple[int, Any]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())


@pytest.fixture
def api(env: dict[str, str], worker: Proc) -> Iterator[Api]:
    port = free_port()
    server_env = {
        **env,
        "UNSTUCK_API__TOKENS": TOKEN,
        "UNSTUCK_API__MAX_BODY_BYTES": "20000",
        "UNSTUCK_AGENTS__LIST": json.dumps([{"id": "narrow", "tool_allow": ["echo"]}]),
    }
    proc = Proc([UNSTUCK, "serve", "--port", str(port)], server_env, "serve")
    try:
        proc.wait_for_log("Uvicorn running on", timeout_s=30)
        yield Api(f"http://127.0.0.1:{port}")
    finally:
        proc.kill()


RUN = "/v1/sessions/http-s/runs/r1"


def test_neutral_calls_get_one_result_each_in_call_order(api: Api) -> None:
    # Given a message with a healthy call, a failing one, an unknown tool and bad arguments
    calls = [
        {"id": "a", "name": "echo", "arguments": {"text": "hi"}},
        {"id": "b", "name": "boom", "arguments": {"message": "disk full"}},
        {"id": "c", "name": "ecoh", "arguments": {}},
        {"id": "d", "name": "echo", "arguments": {"text": 5, "times": "x"}},
    ]
    # When they are posted
    status, body = api.call("POST", f"{RUN}/tool-calls", {"format": "neutral", "message": {"calls": calls}})
    # Then one result per call comes back, in order, with what to append
    assert status == 200, body
    assert [r["toolCallId"] for r in body["results"]] == ["a", "b", "c", "d"]
    reasons = [r["details"].get("reason") for r in body["results"]]
    assert reasons == [None, "tool_error", "unknown_tool", "invalid_arguments"]
    assert body["results"][0]["content"][0]["text"] == "hi"
    assert body["aborted"] is None
    # And the run's results can be collected again later (after a client went away)
    status, again = api.call("GET", f"{RUN}/results?format=neutral")
    assert status == 200
    assert [r["toolCallId"] for r in again["results"]] == ["a", "b", "c", "d"]


def test_errors_are_json_with_the_right_status(api: Api) -> None:
    ok = {"format": "neutral", "message": {"calls": []}}
    assert api.call("POST", f"{RUN}/tool-calls", ok, token=None)[0] == 401
    assert api.call("POST", f"{RUN}/tool-calls", ok, token="wrong")[0] == 401
    status, body = api.call("POST", f"{RUN}/tool-calls", raw=b"{not json")
    assert (status, body["error"]["type"]) == (400, "malformed_json")
    status, body = api.call("POST", f"{RUN}/tool-calls", {"format": "klingon", "message": {}})
    assert (status, body["error"]["type"]) == (422, "invalid_request")
    assert "format" in body["error"]["message"]
    status, body = api.call("POST", f"{RUN}/tool-calls", raw=json.dumps({"message": "x" * 30000}).encode())
    assert (status, body["error"]["type"]) == (413, "body_too_large")


def test_run_lifecycle_sessions_health_and_repair(api: Api) -> None:
    # Heartbeat creates and keeps the run; compaction arms the guard; end frees the lane
    life = "/v1/sessions/life/runs/r1"
    assert api.call("POST", f"{life}/heartbeat", {"what": "model"}) == (200, {"running": True})
    assert api.call("POST", f"{life}/compaction", {}) == (200, {"guard": True})
    status, sessions = api.call("GET", "/v1/sessions")
    assert status == 200
    assert any(row["id"] == "life" and row["status"] == "running" for row in sessions)
    assert api.call("POST", f"{life}/end", {"status": "completed"}) == (200, {"ended": True})
    assert api.call("POST", f"{life}/heartbeat", {}) == (200, {"running": False})
    # Health needs no token
    assert api.call("GET", "/healthz", token=None) == (200, {"ok": True})
    # Repair pairs an orphaned call with a synthetic result
    transcript = [
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": [{"type": "toolCall", "id": "x1", "name": "exec", "arguments": {}}]},
    ]
    status, repaired = api.call("POST", "/v1/repair", {"format": "neutral", "transcript": transcript})
    assert status == 200, repaired
    assert repaired["transcript"][-1]["role"] == "toolResult"
    assert repaired["transcript"][-1]["toolCallId"] == "x1"


def test_tools_per_agent_and_a_refused_call(api: Api) -> None:
    # Given an agent whose allowlist holds only echo
    status, everything = api.call("GET", "/v1/tools?format=neutral")
    assert status == 200
    assert {"echo", "boom", "sleepy"} <= {d["name"] for d in everything}
    # When its tools are listed / Then only echo
    status, narrow = api.call("GET", "/v1/tools?format=anthropic&agent_id=narrow")
    assert (status, [d["name"] for d in narrow]) == (200, ["echo"])
    assert api.call("GET", "/v1/tools?agent_id=")[0] == 422
    # And a call of another tool is answered tool_not_allowed without running
    message = {"calls": [{"id": "n1", "name": "boom", "arguments": {"message": "x"}}]}
    body = {"agent_id": "narrow", "format": "neutral", "message": message}
    status, answer = api.call("POST", "/v1/sessions/narrow-s/runs/r1/tool-calls", body)
    assert status == 200, answer
    assert answer["results"][0]["details"]["reason"] == "tool_not_allowed"


def test_the_openapi_document_describes_the_contract(api: Api) -> None:
    status, spec = api.call("GET", "/openapi.json", token=None)
    assert status == 200
    paths = spec["paths"]
    for path in (
        "/v1/sessions/{session_key}/runs/{run_id}/tool-calls",
        "/v1/sessions/{session_key}/runs/{run_id}/results",
        "/v1/tools",
        "/v1/repair",
        "/healthz",
    ):
        assert path in paths


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
FORMATS = ["neutral", "anthropic", "openai-chat", "openai-responses", "gemini"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from([*FORMATS, "bogus"]), message=JSON, agent=st.text(max_size=5))
def test_no_body_makes_the_server_fail(api: Api, fmt: str, message: Any, agent: str) -> None:
    # Whatever arrives, the answer is a JSON verdict, never a 5xx
    status, body = api.call(
        "POST", f"{RUN}-fuzz/tool-calls", {"format": fmt, "message": message, "agent_id": agent}
    )
    assert status in {200, 422}, body
    if status == 200:
        assert len(body["results"]) == len({r["toolCallId"] for r in body["results"]})
    else:
        assert set(body["error"]) == {"type", "message"}


def test_cancel_answers_the_waiting_request_cancelled(api: Api, env: dict[str, str]) -> None:
    # Given a tool-calls request waiting on a long call
    cancel_run = "/v1/sessions/http-cancel/runs/r1"
    answer: dict[str, Any] = {}
    message = {"calls": [{"id": "long", "name": "slow", "arguments": {"seconds": 30}}]}

    def post() -> None:
        answer["reply"] = api.call(
            "POST", f"{cancel_run}/tool-calls", {"format": "neutral", "message": message}
        )

    waiting = threading.Thread(target=post, daemon=True)
    waiting.start()
    ledger = open_ledger(settings_of(env))
    try:
        keys = ledger.keys("http-cancel", "r1")
        wait_until(lambda: ledger.record(keys, "long") is not None, timeout_s=10, what="registration")
        # When the call is cancelled over HTTP
        assert api.call("POST", f"{cancel_run}/cancel", {"call_id": "long"}) == (200, {"cancelled": 1})
    finally:
        ledger.close()
    # Then the waiting request answers it cancelled (by the worker, after the default grace)
    waiting.join(timeout=30)
    status, body = answer["reply"]
    assert status == 200, body
    assert body["results"][0]["details"]["reason"] == "cancelled"
    # And a cancel without a body cancels whatever is left: nothing
    assert api.call("POST", f"{cancel_run}/cancel") == (200, {"cancelled": 0})
