"""Every tool call a trace: spans read back from an OTLP/HTTP receiver, over every door.

A receiver on loopback (tests/otlp_receiver.py) takes what real processes export with the
standard OTEL_* variables: a tool worker, ``unstuck serve`` and ``unstuck mcp``, and an agent
process (tests/tracing_agent.py) with its own tracer provider and one span around calls of
each outcome: healthy, hung past its hard limit, crashing, past its deadline, refused, and an
asyncio call. Checked for each: names, the GenAI attributes, parentage (one trace, parent span
ids) and status with ``error.type``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import mcp_types as types
import pytest
from mcp import Client

from tests.e2e.conftest import Processes
from tests.harness import REPO, UNSTUCK, Proc, settings_of, wait_until
from tests.otlp_receiver import ReceivedSpan, Receiver, otlp_receiver
from workers.local.embedded_redis import free_port
from workers.runtime import open_ledger

pytestmark = [pytest.mark.slow]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
HTTP_PARENT = "00f067aa0ba902b7"
MCP_PARENT = "b7ad6b7169203331"
TOKEN = "trace-token"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as running:
        yield running


@pytest.fixture
def traced_env(backbone_env: dict[str, str], receiver: Receiver) -> dict[str, str]:
    return {
        **backbone_env,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
    }


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    matching = [span for span in spans if span.name == name]
    assert len(matching) == 1, (name, spans)
    return matching[0]


def _spans_of(receiver: Receiver, call_id: str, *names: str, timeout_s: float = 20.0) -> list[ReceivedSpan]:
    """The spans of a call once every one of ``names`` arrived."""

    def arrived() -> bool:
        got = {span.name for span in receiver.with_call(call_id)}
        return set(names) <= got

    wait_until(arrived, timeout_s=timeout_s, interval_s=0.1, what=f"spans {names} of {call_id}")
    return receiver.with_call(call_id)


def _check_tool_span(span: ReceivedSpan, tool: str, call_id: str, session: str) -> None:
    assert span.kind == "INTERNAL"
    assert span.attributes["gen_ai.operation.name"] == "execute_tool"
    assert span.attributes["gen_ai.tool.name"] == tool
    assert span.attributes["gen_ai.tool.call.id"] == call_id
    assert span.attributes["gen_ai.tool.type"] == "function"
    assert span.attributes["gen_ai.conversation.id"] == session


def _check_error(span: ReceivedSpan, reason: str) -> None:
    assert (span.status, span.attributes.get("error.type")) == ("ERROR", reason), span


@pytest.mark.timeout(120)
def test_agent_calls_of_every_outcome_in_the_agents_trace(
    traced_env: dict[str, str], receiver: Receiver, processes: Processes, tmp_path: Path
) -> None:
    # Given a traced worker and an agent process with its own span around its calls
    processes.worker(traced_env, name="traced", concurrency=3)
    out = tmp_path / "agent.json"
    env = {**traced_env, "UNSTUCK_LIMITS__QUEUE_ALLOWANCE_S": "1"}
    subprocess.run(
        [sys.executable, "-m", "tests.tracing_agent", str(out)], env=env, cwd=REPO, check=True, timeout=90
    )
    agent = json.loads(out.read_text())
    assert agent["reasons"] == {
        "c-healthy": None,
        "c-hung": "timeout_hard",
        "c-crash": "crashed",
        "c-refused": "unknown_tool",
        "c-deadline": "deadline_exceeded",
        "c-async": None,
    }
    trace_id, agent_span = agent["trace_id"], agent["span_id"]
    # Then each call is an execute_tool span, a child of the agent's span, in its trace
    expected = {
        "c-healthy": ("echo", None),
        "c-hung": ("stubborn", "timeout_hard"),
        "c-crash": ("crash", "crashed"),
        "c-refused": ("no_such_tool", "unknown_tool"),
        "c-deadline": ("echo", "deadline_exceeded"),
        "c-async": ("echo", None),
    }
    sessions = {"c-deadline": "trace-deadline", "c-async": "trace-async"}
    ran = {"c-healthy", "c-hung", "c-crash", "c-async"}  # a worker claimed these
    for call_id, (tool, reason) in expected.items():
        names = [f"execute_tool {tool}"] + ([f"unstuck.run {tool}"] if call_id in ran else [])
        spans = _spans_of(receiver, call_id, *names)
        caller = _one(spans, f"execute_tool {tool}")
        _check_tool_span(caller, tool, call_id, sessions.get(call_id, "trace-s"))
        assert (caller.trace_id, caller.parent_id, caller.service) == (trace_id, agent_span, "agent"), call_id
        if reason is None:
            assert caller.status == "UNSET"
        else:
            _check_error(caller, reason)
        if call_id not in ran:
            assert caller.attributes["unstuck.answered_by"] == "gateway"  # deadline, refusal
            continue
        # ... and the worker's execution its child, with the attempt; a dead child's ended by
        # the worker's main process with the reason it answered
        run = _one(spans, f"unstuck.run {tool}")
        assert (run.trace_id, run.parent_id, run.kind) == (trace_id, caller.span_id, "CONSUMER")
        assert run.attributes["unstuck.attempt"] == 1
        assert run.service == "unstuck"
        if reason is None:
            assert (run.status, run.attributes["unstuck.answered_by"]) == ("UNSET", "worker")
        else:
            _check_error(run, reason)
            assert run.attributes["unstuck.answered_by"] == "worker main process"
            assert run.end_ns > run.start_ns


@pytest.mark.timeout(120)
def test_http_and_mcp_doors_join_the_callers_trace(
    traced_env: dict[str, str], receiver: Receiver, processes: Processes
) -> None:
    # Given a traced worker, HTTP door and MCP door
    processes.worker(traced_env, name="doors", concurrency=2)
    http_port, mcp_port = free_port(), free_port()
    serve_env = {**traced_env, "UNSTUCK_API__TOKENS": TOKEN}
    serve = processes.track(Proc([UNSTUCK, "serve", "--port", str(http_port)], serve_env, "serve"))
    mcp = processes.track(Proc([UNSTUCK, "mcp", "--port", str(mcp_port)], traced_env, "mcp"))
    serve.wait_for_log("Uvicorn running on", timeout_s=60)
    mcp.wait_for_log("Streamable HTTP on", timeout_s=60)
    # When a call comes over HTTP with a traceparent header
    body = {"message": {"calls": [{"id": "c-http", "name": "echo", "arguments": {"text": "h"}}]}}
    request = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/v1/sessions/trace-http/runs/r1/tool-calls",
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {TOKEN}",
            "traceparent": f"00-{TRACE_ID}-{HTTP_PARENT}-01",
        },
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
    # ... and one over MCP with params._meta.traceparent
    mcp_result = _mcp_call(f"http://127.0.0.1:{mcp_port}/mcp", f"00-{TRACE_ID}-{MCP_PARENT}-01")
    assert not mcp_result.is_error
    assert mcp_result.meta is not None
    mcp_call_id = mcp_result.meta["unstuck/call"]
    # Then each is an execute_tool span under the caller's span, the worker's run under it
    for call_id, parent in (("c-http", HTTP_PARENT), (mcp_call_id, MCP_PARENT)):
        spans = _spans_of(receiver, call_id, "execute_tool echo", "unstuck.run echo")
        caller = _one(spans, "execute_tool echo")
        _check_tool_span(caller, "echo", call_id, caller.attributes["gen_ai.conversation.id"])
        assert (caller.trace_id, caller.parent_id, caller.status) == (TRACE_ID, parent, "UNSET")
        run = _one(spans, "unstuck.run echo")
        assert (run.trace_id, run.parent_id) == (TRACE_ID, caller.span_id)


@pytest.mark.timeout(120)
def test_a_lost_worker_is_answered_by_the_watchdog_in_the_callers_trace(
    traced_env: dict[str, str], receiver: Receiver, processes: Processes, tmp_path: Path
) -> None:
    # Given a traced worker, watchdog and beat, and an agent whose call runs on that worker
    worker = processes.worker(traced_env, name="lost", concurrency=1)
    processes.watchdog(traced_env, name="lost")
    processes.beat(traced_env)
    out = tmp_path / "agent.json"
    agent = processes.track(
        Proc([sys.executable, "-m", "tests.tracing_agent", str(out), "--lost"], traced_env, "agent")
    )
    ledger = open_ledger(settings_of(traced_env))
    keys = ledger.keys("trace-lost", "r1")

    def running() -> bool:
        record = ledger.record(keys, "c-lost")
        return record is not None and record.state.value == "running"

    wait_until(running, timeout_s=30, what="the call running")
    record = ledger.record(keys, "c-lost")
    assert record is not None
    ids = json.loads(out.read_text())
    # When the agent's process and the worker's whole host go (nobody but the watchdog is left)
    os.kill(agent.pid, signal.SIGKILL)
    os.killpg(worker.pid, signal.SIGKILL)
    spans = _spans_of(receiver, "c-lost", "unstuck.answer slow", "unstuck.run slow", timeout_s=30)
    ledger.close()
    # Then the watchdog's answer is a span under the call's span, from the context the ledger kept
    traceparent = record.fields["traceparent"]
    _, trace_id, call_span, _ = traceparent.split("-")
    assert trace_id == ids["trace_id"]
    answer = _one(spans, "unstuck.answer slow")
    assert (answer.trace_id, answer.parent_id) == (trace_id, call_span)
    _check_error(answer, "worker_lost")
    assert answer.attributes["unstuck.answered_by"] == "watchdog"
    # ... and the lost attempt's span, which its child never ended, is ended by the watchdog
    run = _one(spans, "unstuck.run slow")
    assert (run.trace_id, run.parent_id, run.attributes["unstuck.attempt"]) == (trace_id, call_span, 1)
    _check_error(run, "worker_lost")


def _mcp_call(url: str, traceparent: str) -> types.CallToolResult:
    import anyio

    async def call() -> types.CallToolResult:
        async with Client(url, read_timeout_seconds=60.0) as client:
            meta = cast(types.RequestParamsMeta, {"traceparent": traceparent})
            result: Any = await client.call_tool("echo", {"text": "m"}, meta=meta)
            return cast(types.CallToolResult, result)

    return anyio.run(call)
