"""Fuzz every input of ``unstuck serve``: paths, tokens, agents, bodies; no 5xx, no unauthorised run.

Extends ``test_http_api.py``'s body fuzz (one route, one valid token) to every route, with
missing, wrong and valid tokens, agents whose allowlist refuses the tool, odd session keys
and raw bytes. ``record_run`` appends one line per execution to a file: afterwards each line
must belong to a request that was allowed to run it. The counts are printed (``pytest -s``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness import UNSTUCK, Proc, base_env, start_worker
from workers.local.embedded_redis import free_port

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

TOKEN = "fuzz-t0ken"
EXAMPLES = 250
ROUTES = ["tool-calls", "results", "compaction", "heartbeat", "end", "tools", "repair", "sessions", "healthz"]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=16,
)
PART = st.text(min_size=1, max_size=12) | st.sampled_from(["s", "..", "%2F", "{x}", "a/b", " ", "é"])


@pytest.fixture
def runs_file(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture
def fuzz_env(redis_url: str, runs_file: Path) -> dict[str, str]:
    return base_env(
        redis_url,
        RECORD_RUN_FILE=str(runs_file),
        UNSTUCK_API__TOKENS=TOKEN,
        UNSTUCK_API__MAX_BODY_BYTES="20000",
        UNSTUCK_AGENTS__LIST=json.dumps([{"id": "narrow", "tool_allow": ["echo"]}]),
    )


@pytest.fixture
def server(fuzz_env: dict[str, str]) -> Iterator[str]:
    worker = start_worker(fuzz_env, name="http-fuzz")
    port = free_port()
    proc = Proc([UNSTUCK, "serve", "--port", str(port)], fuzz_env, "serve-fuzz")
    try:
        proc.wait_for_log("Uvicorn running on", timeout_s=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        worker.kill()


def _request(url: str, method: str, data: bytes | None, token: str | None) -> int:
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        error.read()
        return int(error.code)


def _calls(data: st.DataObject, tag: str) -> list[Any]:
    """A tool-calls message's calls: the recording tool, a shell, or noise."""
    record = {"id": tag, "name": "record_run", "arguments": {"tag": tag}}
    shell = {"id": f"{tag}x", "name": "exec", "arguments": {"command": "touch /tmp/unstuck-http-fuzz-pwned"}}
    return data.draw(st.lists(st.sampled_from([record, shell]) | JSON, min_size=1, max_size=3))


def _path(route: str, session: str, run: str, data: st.DataObject) -> str:
    run_path = f"/v1/sessions/{urllib.parse.quote(session, safe='')}/runs/{urllib.parse.quote(run, safe='')}"
    if route in ("tools", "sessions"):
        query = data.draw(
            st.sampled_from(["", "?format=anthropic", "?agent_id=narrow", "?format=x&agent_id="])
        )
        return f"/v1/{route}{query}"
    if route == "repair":
        return "/v1/repair"
    if route == "healthz":
        return "/healthz"
    query = (
        "?format=" + data.draw(st.sampled_from(["neutral", "gemini", "bogus"])) if route == "results" else ""
    )
    return f"{run_path}/{route}{query}"


def test_no_request_fails_the_server_or_runs_what_it_may_not(server: str, runs_file: Path) -> None:
    allowed: set[str] = set()
    refused: set[str] = set()
    statuses: Counter[int] = Counter()
    kinds: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(
        data=st.data(),
        route=st.sampled_from(ROUTES) | st.just("tool-calls"),
        token=st.just(TOKEN) | st.sampled_from([TOKEN, None, "wrong", TOKEN + "x", ""]),
        agent=st.sampled_from(["main", "narrow"]) | st.text(max_size=6),
        session=PART,
        run=PART,
    )
    def request_one(
        data: st.DataObject, route: str, token: str | None, agent: str, session: str, run: str
    ) -> None:
        tag = f"h{len(allowed) + len(refused)}"
        payload: Any = data.draw(
            st.fixed_dictionaries(
                {"format": st.sampled_from(["neutral", "anthropic", "bogus"]), "message": JSON},
                optional={"agent_id": st.just(agent), "status": st.text(max_size=8), "transcript": JSON},
            )
        )
        if route == "tool-calls" and data.draw(st.booleans()):
            payload = {"format": "neutral", "agent_id": agent, "message": {"calls": _calls(data, tag)}}
            authorised = token == TOKEN and agent != "narrow"
            (allowed if authorised else refused).add(tag)
            kinds["record_run allowed" if authorised else "record_run refused"] += 1
        raw = data.draw(
            st.just(json.dumps(payload).encode())
            | st.just(json.dumps(payload).encode())
            | st.binary(max_size=40)
        )
        right = "GET" if route in ("tools", "sessions", "healthz", "results") else "POST"
        method = data.draw(st.just(right) | st.just(right) | st.sampled_from(["GET", "POST"]))
        status = _request(
            server + _path(route, session, run, data), method, raw if method == "POST" else None, token
        )
        statuses[status] += 1
        kinds[route] += 1
        assert status < 500, (route, method, status)

    request_one()
    # And a genuine request after them (the control: executions are seen)
    control = {
        "format": "neutral",
        "message": {"calls": [{"id": "ok", "name": "record_run", "arguments": {"tag": "ok"}}]},
    }
    assert (
        _request(f"{server}/v1/sessions/ok/runs/r/tool-calls", "POST", json.dumps(control).encode(), TOKEN)
        == 200
    )
    runs = set(runs_file.read_text().splitlines()) if runs_file.exists() else set()
    # Every execution belongs to a request with a valid token, for an agent allowed the tool
    assert "ok" in runs
    assert runs - {"ok"} <= allowed
    assert not runs & refused
    assert not Path("/tmp/unstuck-http-fuzz-pwned").exists()
    print(
        f"\nhttp fuzz: {sum(statuses.values())} requests {dict(sorted(kinds.items()))}; "
        f"statuses {dict(sorted(statuses.items()))}; record_run attempts: {len(allowed)} authorised, "
        f"{len(refused)} unauthorised; executions: {len(runs)} (0 unauthorised)"
    )
