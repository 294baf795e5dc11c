"""Every tool call a trace: spans read back from an OTLP/HTTP receiver, over every door.

A receiver on loopback (tests/otlp_receiver.py) takes what real processes export with the
standard OTEL_* variables: a tool worker, ``unstuck serve`` and ``unstuck mcp`` (one stack for
the module), and agent processes (tests/tracing_agent.py) with their own tracer provider and
one span around their calls: healthy, hung past its hard limit, past its soft limit, crashing,
past its deadline, refused at admission (unknown tool, invalid arguments, a tool not allowed,
a loop block), cancelled (queued and running, by the gateway; through another process's door),
asyncio; a worker lost; an idempotent call re-run after its worker was lost, by its own gateway
and by a new gateway collecting the run. Checked for each: names, the GenAI attributes,
parentage (one trace, parent span ids), status with ``error.type``, and links between attempts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mcp_types as types
import pytest
from mcp import Client

from tests.e2e.conftest import Processes
from tests.harness import REPO, UNSTUCK, Proc, base_env, settings_of, wait_until
from tests.otlp_receiver import ReceivedSpan, Receiver, otlp_receiver
from workers import ToolCall, ToolGateway
from workers.local.embedded_redis import EmbeddedRedis, free_port
from workers.runtime import open_ledger

pytestmark = [pytest.mark.slow]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
HTTP_PARENT = "00f067aa0ba902b7"
MCP_PARENT = "b7ad6b7169203331"
TOKEN = "trace-token"
# The agent's loop detection: the third identical call in a row is blocked at admission.
LOOPS = {"enabled": True, "historySize": 30, "warningThreshold": 1, "criticalThreshold": 2}


@dataclass(frozen=True)
class Stack:
    """The module's receiver and traced processes: a worker, the HTTP and MCP doors."""

    receiver: Receiver
    env: dict[str, str]
    http_port: int
    mcp_port: int


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with otlp_receiver() as receiver:
        server = EmbeddedRedis().start()
        env = {
            **base_env(server.url, UNSTUCK_WATCHDOG__INTERVAL_S="1"),
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        }
        started = Processes()
        try:
            http_port, mcp_port = free_port(), free_port()
            worker_env = {**env, "UNSTUCK_LIMITS__CANCEL_GRACE_S": "1"}
            worker = started.track(
                Proc([UNSTUCK, "worker", "-c", "5", "-n", "traced@%h", "-l", "INFO"], worker_env, "worker")
            )
            serve_env = {**env, "UNSTUCK_API__TOKENS": TOKEN}
            serve = started.track(Proc([UNSTUCK, "serve", "--port", str(http_port)], serve_env, "serve"))
            mcp = started.track(Proc([UNSTUCK, "mcp", "--port", str(mcp_port)], env, "mcp"))
            worker.wait_for_log(" ready.", timeout_s=60)
            serve.wait_for_log("Uvicorn running on", timeout_s=60)
            mcp.wait_for_log("Streamable HTTP on", timeout_s=60)
            yield Stack(receiver, env, http_port, mcp_port)
        finally:
            started.close()
            server.close()


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


def _runs_arrived(receiver: Receiver, call_id: str, *, attempts: list[int]) -> dict[int, ReceivedSpan]:
    """The ``unstuck.run`` spans of a call by attempt, once each of ``attempts`` arrived."""

    def runs() -> dict[int, ReceivedSpan]:
        spans = receiver.with_call(call_id)
        return {s.attributes["unstuck.attempt"]: s for s in spans if s.name.startswith("unstuck.run")}

    wait_until(lambda: sorted(runs()) == attempts, timeout_s=20.0, interval_s=0.1,
               what=f"unstuck.run spans of attempts {attempts} of {call_id}")  # fmt: skip
    return runs()


def _check_tool_span(
    span: ReceivedSpan, tool: str, call_id: str, session: str, *, kind: str = "INTERNAL"
) -> None:
    assert span.kind == kind
    assert span.attributes["gen_ai.operation.name"] == "execute_tool"
    assert span.attributes["gen_ai.tool.name"] == tool
    assert span.attributes["gen_ai.tool.call.id"] == call_id
    assert span.attributes["gen_ai.tool.type"] == "function"
    assert span.attributes["gen_ai.conversation.id"] == session


def _check_error(span: ReceivedSpan, reason: str) -> None:
    assert (span.status, span.attributes.get("error.type")) == ("ERROR", reason), span


def _check_status(span: ReceivedSpan, reason: str | None) -> None:
    """UNSET for the tool's own result, else ERROR with the reason as error.type."""
    if reason is None:
        assert (span.status, span.attributes.get("error.type")) == ("UNSET", None), span
    else:
        _check_error(span, reason)


@dataclass(frozen=True)
class Outcome:
    """What one call of the agent must show: its tool, session, reason, and who wrote the answer."""

    tool: str
    session: str
    reason: str | None
    ran: bool  # a worker claimed it: an unstuck.run span under the call's
    answered_by: str | None = None  # on the caller's execute_tool span
    run_answered_by: str = "worker"  # on the unstuck.run span


OUTCOMES = {
    "c-healthy": Outcome("echo", "trace-s", None, ran=True, answered_by="worker"),
    "c-hung": Outcome("stubborn", "trace-s", "timeout_hard", ran=True, run_answered_by="worker main process"),
    "c-soft": Outcome("sleepy", "trace-s", "timeout_soft", ran=True),
    "c-crash": Outcome("crash", "trace-s", "crashed", ran=True, run_answered_by="worker main process"),
    "c-refused": Outcome("no_such_tool", "trace-s", "unknown_tool", ran=False, answered_by="gateway"),
    "c-invalid": Outcome("echo", "trace-s", "invalid_arguments", ran=False, answered_by="gateway"),
    "c-denied": Outcome("record_run", "trace-s", "tool_not_allowed", ran=False, answered_by="gateway"),
    "c-loop-1": Outcome("boom", "trace-loop", "tool_error", ran=True, answered_by="worker"),
    "c-loop-2": Outcome("boom", "trace-loop", "tool_error", ran=True, answered_by="worker"),
    "c-loop-3": Outcome("boom", "trace-loop", "loop_blocked", ran=False, answered_by="gateway"),
    "c-deadline": Outcome("echo", "trace-deadline", "deadline_exceeded", ran=False, answered_by="gateway"),
    "c-cancel-queued": Outcome("echo", "trace-cancel-q", "cancelled", ran=False, answered_by="gateway"),
    # Cancelled through the HTTP door: another process's answer (its unstuck.answer span below).
    "c-cancel-door": Outcome("echo", "trace-cancel-door", "cancelled", ran=False),
    # Running, not cooperative: the worker's main process answers once the cancel's grace is over.
    "c-cancel-running": Outcome(
        "slow", "trace-cancel-r", "cancelled", ran=True, run_answered_by="worker main process"
    ),
    "c-async": Outcome("echo", "trace-async", None, ran=True, answered_by="worker"),
}


@pytest.mark.timeout(150)
def test_agent_calls_of_every_outcome_in_the_agents_trace(stack: Stack, tmp_path: Path) -> None:
    # Given the traced stack and an agent process with its own span around its calls
    out = tmp_path / "agent.json"
    env = {
        **stack.env,
        "UNSTUCK_LIMITS__QUEUE_ALLOWANCE_S": "1",
        "UNSTUCK_TOOLS__DENY": "record_run",
        "UNSTUCK_TOOLS__LOOP_DETECTION": json.dumps(LOOPS),
        "TRACING_HTTP_PORT": str(stack.http_port),
        "TRACING_HTTP_TOKEN": TOKEN,
    }
    subprocess.run(
        [sys.executable, "-m", "tests.tracing_agent", str(out)], env=env, cwd=REPO, check=True, timeout=120
    )
    agent = json.loads(out.read_text())
    assert agent["reasons"] == {call_id: outcome.reason for call_id, outcome in OUTCOMES.items()}
    trace_id, agent_span = agent["trace_id"], agent["span_id"]
    for call_id, outcome in OUTCOMES.items():
        tool = outcome.tool
        names = [f"execute_tool {tool}"] + ([f"unstuck.run {tool}"] if outcome.ran else [])
        spans = _spans_of(stack.receiver, call_id, *names)
        # Then each call is an execute_tool span, a child of the agent's span, in its trace
        caller = _one(spans, f"execute_tool {tool}")
        _check_tool_span(caller, tool, call_id, outcome.session)
        assert (caller.trace_id, caller.parent_id, caller.service) == (trace_id, agent_span, "agent"), call_id
        _check_status(caller, outcome.reason)
        assert caller.attributes.get("unstuck.answered_by") == outcome.answered_by, call_id
        if not outcome.ran:
            assert not [span for span in spans if span.name.startswith("unstuck.run")], call_id
            continue
        # ... and the worker's execution its child, with the attempt; a dead (or cancelled)
        # child's ended by the worker's main process with the reason it answered, once
        run = _one(spans, f"unstuck.run {tool}")
        assert (run.trace_id, run.parent_id, run.kind) == (trace_id, caller.span_id, "CONSUMER"), call_id
        assert (run.attributes["unstuck.attempt"], run.service) == (1, "unstuck"), call_id
        assert run.attributes["gen_ai.tool.call.id"] == call_id
        _check_status(run, outcome.reason)
        assert run.attributes["unstuck.answered_by"] == outcome.run_answered_by, call_id
        assert run.end_ns > run.start_ns
    # And the cancel written by the HTTP door's process is its own span under the caller's
    caller = _one(stack.receiver.with_call("c-cancel-door"), "execute_tool echo")
    answer = _one(_spans_of(stack.receiver, "c-cancel-door", "unstuck.answer echo"), "unstuck.answer echo")
    assert (answer.trace_id, answer.parent_id, answer.kind) == (trace_id, caller.span_id, "INTERNAL")
    _check_tool_span(answer, "echo", "c-cancel-door", "trace-cancel-door")
    _check_error(answer, "cancelled")
    assert answer.attributes["unstuck.answered_by"] == "gateway"
    # ... and a blocked loop names its detector's reason, not the tool's error
    assert _one(stack.receiver.with_call("c-loop-3"), "execute_tool boom").attributes["unstuck.reason"] == (
        "loop_blocked"
    )


@pytest.mark.timeout(120)
def test_http_and_mcp_doors_join_the_callers_trace(stack: Stack) -> None:
    # Given the traced HTTP and MCP doors
    # When a call comes over HTTP with a traceparent header
    body = {"message": {"calls": [{"id": "c-http", "name": "echo", "arguments": {"text": "h"}}]}}
    request = urllib.request.Request(
        f"http://127.0.0.1:{stack.http_port}/v1/sessions/trace-http/runs/r1/tool-calls",
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
    mcp_result = _mcp_call(f"http://127.0.0.1:{stack.mcp_port}/mcp", f"00-{TRACE_ID}-{MCP_PARENT}-01")
    assert not mcp_result.is_error
    assert mcp_result.meta is not None
    mcp_call_id = mcp_result.meta["unstuck/call"]
    # Then each is an execute_tool span under the caller's span, the worker's run under it
    for call_id, parent in (("c-http", HTTP_PARENT), (mcp_call_id, MCP_PARENT)):
        spans = _spans_of(stack.receiver, call_id, "execute_tool echo", "unstuck.run echo")
        caller = _one(spans, "execute_tool echo")
        _check_tool_span(caller, "echo", call_id, caller.attributes["gen_ai.conversation.id"])
        assert (caller.trace_id, caller.parent_id, caller.status) == (TRACE_ID, parent, "UNSET")
        run = _one(spans, "unstuck.run echo")
        assert (run.trace_id, run.parent_id) == (TRACE_ID, caller.span_id)


def _agent(env: dict[str, str], out: Path, *mode: str) -> Proc:
    return Proc([sys.executable, "-m", "tests.tracing_agent", str(out), *mode], env, f"agent{'-'.join(mode)}")


def _wait_running(env: dict[str, str], session_key: str, call_id: str) -> dict[str, str]:
    """The call's record fields once a worker runs it."""
    ledger = open_ledger(settings_of(env))
    keys = ledger.keys(session_key, "r1")
    try:

        def running() -> bool:
            record = ledger.record(keys, call_id)
            return record is not None and record.state.value == "running"

        wait_until(running, timeout_s=30, what=f"{call_id} running")
        record = ledger.record(keys, call_id)
        assert record is not None
        return dict(record.fields)
    finally:
        ledger.close()


@pytest.mark.timeout(120)
def test_a_lost_worker_is_answered_by_the_watchdog_in_the_callers_trace(
    stack: Stack, processes: Processes, tmp_path: Path
) -> None:
    # Given a traced worker on a queue of its own, a watchdog and beat, and an agent whose call runs there
    env = {**stack.env, "UNSTUCK_BROKER__QUEUE": "lost"}
    worker = processes.worker(env, name="lost", concurrency=1)
    processes.watchdog(env, name="lost")
    processes.beat(env)
    out = tmp_path / "agent.json"
    agent = processes.track(_agent(env, out, "--lost"))
    fields = _wait_running(env, "trace-lost", "c-lost")
    ids = json.loads(out.read_text())
    # When the agent's process and the worker's whole host go (nobody but the watchdog is left)
    os.kill(agent.pid, signal.SIGKILL)
    os.killpg(worker.pid, signal.SIGKILL)
    spans = _spans_of(stack.receiver, "c-lost", "unstuck.answer slow", "unstuck.run slow", timeout_s=30)
    # Then the watchdog's answer is a span under the call's span, from the context the ledger kept
    _, trace_id, call_span, _ = fields["traceparent"].split("-")
    assert trace_id == ids["trace_id"]
    answer = _one(spans, "unstuck.answer slow")
    assert (answer.trace_id, answer.parent_id) == (trace_id, call_span)
    _check_tool_span(answer, "slow", "c-lost", "trace-lost")
    _check_error(answer, "worker_lost")
    assert answer.attributes["unstuck.answered_by"] == "watchdog"
    # ... and the lost attempt's span, which its child never ended, is ended by the watchdog
    run = _one(spans, "unstuck.run slow")
    assert (run.trace_id, run.parent_id, run.attributes["unstuck.attempt"]) == (trace_id, call_span, 1)
    _check_error(run, "worker_lost")


@pytest.mark.timeout(120)
def test_every_worker_span_of_a_fresh_worker_arrives_though_its_child_crashes_next(
    stack: Stack, processes: Processes
) -> None:
    # Given a fresh traced worker with default settings and one pool child, on a queue of its own
    env = {**stack.env, "UNSTUCK_BROKER__QUEUE": "fresh"}
    processes.worker(env, name="fresh", concurrency=1)
    gateway = ToolGateway(settings_of(env))
    healthy = [f"c-fresh-{i}" for i in range(4)]
    calls = [ToolCall(id=call_id, name="echo", arguments={"text": call_id}) for call_id in healthy]
    # When healthy calls run back to back in that child, and the next call kills it at once
    # (the batch is dispatched together, so the crash starts within milliseconds of the last
    # healthy call's end: before a 200 ms batch would have been sent)
    calls.append(ToolCall(id="c-fresh-crash", name="crash", arguments={}))
    try:
        results = gateway.call_tools(session_key="trace-fresh", run_id="r1", calls=calls)
    finally:
        gateway.close()
    assert [r.reason for r in results] == [None] * len(healthy) + ["crashed"]
    # Then every healthy call's unstuck.run span, ended in the child, reaches the collector
    for call_id in healthy:
        run = _one(_spans_of(stack.receiver, call_id, "unstuck.run echo"), "unstuck.run echo")
        assert (run.status, run.attributes["unstuck.answered_by"]) == ("UNSET", "worker"), call_id
    # ... and the crashed call's, which the worker's main process ends
    _check_error(_one(_spans_of(stack.receiver, "c-fresh-crash", "unstuck.run crash"), "unstuck.run crash"),
                 "crashed")  # fmt: skip


@pytest.mark.timeout(150)
def test_a_call_rerun_after_a_lost_worker_links_its_attempts_in_the_callers_trace(
    stack: Stack, processes: Processes, tmp_path: Path
) -> None:
    # Given two agents whose idempotent calls hang on a worker of a queue of their own
    env = {**stack.env, "UNSTUCK_BROKER__QUEUE": "requeue"}
    first = processes.worker(env, name="requeue-1", concurrency=2)
    own_out, gone_out, collect_out = tmp_path / "own.json", tmp_path / "gone.json", tmp_path / "collect.json"
    own = processes.track(_agent(env, own_out, "--requeue", "trace-rerun-own", "c-rerun-own"))
    gone = processes.track(_agent(env, gone_out, "--requeue", "trace-rerun-gone", "c-rerun-gone"))
    fields = {
        call_id: _wait_running(env, f"trace-rerun-{who}", call_id)
        for who, call_id in (("own", "c-rerun-own"), ("gone", "c-rerun-gone"))
    }
    gone_ids = json.loads(gone_out.read_text())
    # When that worker's host goes, with the second agent's process, and another worker is up
    os.kill(gone.pid, signal.SIGKILL)
    os.killpg(first.pid, signal.SIGKILL)
    processes.worker(env, name="requeue-2", concurrency=2)
    # ... the first agent's gateway re-runs its call; a new gateway collects the second's run
    collector = processes.track(_agent(env, collect_out, "--collect", "trace-rerun-gone"))
    wait_until(lambda: collector.process.poll() is not None and own.process.poll() is not None, timeout_s=60,
               what="the re-run calls answered")  # fmt: skip
    assert json.loads(own_out.read_text())["answers"]["c-rerun-own"]["text"] == "c-rerun-own attempt 2"
    collected = json.loads(collect_out.read_text())
    assert collected["answers"]["c-rerun-gone"]["text"] == "c-rerun-gone attempt 2"
    # Then each attempt is an unstuck.run span under the call's execute_tool: the second links
    # the first, which the gateway that re-ran the call ended as lost
    for call_id in ("c-rerun-own", "c-rerun-gone"):
        # Attempt 1's span (ended by whoever re-ran the call) and attempt 2's (the new worker's
        # child, sent after its answer was stored) come from two processes: wait for both
        runs = _runs_arrived(stack.receiver, call_id, attempts=[1, 2])
        _, trace_id, call_span, _ = fields[call_id]["traceparent"].split("-")
        for run in runs.values():
            assert (run.trace_id, run.parent_id) == (trace_id, call_span), call_id
            session = f"trace-rerun-{call_id.removeprefix('c-rerun-')}"
            _check_tool_span(run, "record_attempt", call_id, session, kind="CONSUMER")
        _check_error(runs[1], "worker_lost")
        assert runs[1].attributes["unstuck.requeued"] is True
        assert (runs[2].status, runs[2].links) == ("UNSET", [(trace_id, runs[1].span_id)]), (call_id, runs)
    # ... the surviving agent's execute_tool ends with the answer; the collector's own span
    # (the first agent's died with it) is in the collector's trace, linked to the call's
    own_caller = _one(stack.receiver.with_call("c-rerun-own"), "execute_tool record_attempt")
    assert (own_caller.status, own_caller.attributes["unstuck.answered_by"]) == ("UNSET", "worker")
    gone_callers = [s for s in stack.receiver.with_call("c-rerun-gone") if s.name.startswith("execute_tool")]
    assert len(gone_callers) == 1, gone_callers  # the dead agent's never ended
    assert gone_callers[0].trace_id == collected["trace_id"] != gone_ids["trace_id"]
    assert gone_callers[0].parent_id == collected["span_id"]
    assert gone_callers[0].links == [
        (gone_ids["trace_id"], fields["c-rerun-gone"]["traceparent"].split("-")[2])
    ]
    assert gone_callers[0].attributes["unstuck.collected"] is True


def _mcp_call(url: str, traceparent: str) -> types.CallToolResult:
    import anyio

    async def call() -> types.CallToolResult:
        async with Client(url, read_timeout_seconds=60.0) as client:
            meta = cast(types.RequestParamsMeta, {"traceparent": traceparent})
            result: Any = await client.call_tool("echo", {"text": "m"}, meta=meta)
            return cast(types.CallToolResult, result)

    return anyio.run(call)
