"""An agent process for the tracing e2e test: one agent span around calls of every outcome.

Run as ``python -m tests.tracing_agent OUT.json [MODE]`` with the OTEL_* variables set. Without
a mode: calls of every outcome (healthy, hard and soft limits, crash, refusals at admission,
a loop block, deadline, three cancels, asyncio), the agent span's ids and each call's reason
(None: the tool's own result) written to OUT.json; $TRACING_HTTP_PORT and $TRACING_HTTP_TOKEN
name the HTTP door one cancel goes through. ``--lost``: one long call, the ids written before
it (the test kills this process and the worker). ``--requeue SESSION CALL_ID``: one idempotent
call whose first attempt hangs. ``--collect SESSION``: collect a run another agent left. The
agent sets up its own tracer provider (as an application would); unstuck's spans join it.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import sys
import threading
import time
import urllib.request

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from workers import ToolCall, ToolGateway, ToolResult
from workers.settings import load_settings


def _ids(span: trace.Span) -> dict[str, str]:
    context = span.get_span_context()
    return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}


def one_call(out: str, session_key: str, call: ToolCall) -> None:
    """One call that may outlive this process: the ids are written before it, the answer after."""
    gateway = ToolGateway(load_settings())
    with trace.get_tracer("agent").start_as_current_span("agent") as agent:
        with open(out, "w") as file:
            json.dump(_ids(agent), file)
        results = gateway.call_tools(session_key=session_key, run_id="r1", calls=[call])
    _write_answers(out, agent, results)


def collect(out: str, session_key: str) -> None:
    """Collect a run another agent process started (and died in), under an agent span of its own."""
    gateway = ToolGateway(load_settings())
    with trace.get_tracer("agent").start_as_current_span("agent") as agent:
        results = gateway.collect(session_key, "r1")
    _write_answers(out, agent, results)


def _write_answers(out: str, agent: trace.Span, results: list[ToolResult]) -> None:
    answers = {r.tool_call_id: {"reason": r.reason, "text": r.text} for r in results}
    with open(out, "w") as file:
        json.dump({**_ids(agent), "answers": answers}, file)


def main(out: str) -> None:
    settings = load_settings()
    gateway = ToolGateway(settings)
    # Each run its own session (a session's new run supersedes its older one).
    # A queue no worker reads: its calls wait there until answered by the gateway (deadline,
    # cancel) or by the HTTP door's cancel.
    nobody = settings.model_copy(update={"broker": settings.broker.model_copy(update={"queue": "nobody"})})
    lonely_gateway = ToolGateway(nobody)
    results: dict[str, ToolResult] = {}

    def call(on: ToolGateway, session_key: str, *calls: ToolCall) -> None:
        results.update(
            (r.tool_call_id, r) for r in on.call_tools(session_key=session_key, run_id="r1", calls=calls)
        )

    with trace.get_tracer("agent").start_as_current_span("agent") as agent:
        # A thread starts with no context: each is given the agent's (as an application would).
        waiting = [
            (
                lonely_gateway,
                "trace-deadline",
                ToolCall(id="c-deadline", name="echo", arguments={"text": "x"}),
            ),
            (
                lonely_gateway,
                "trace-cancel-q",
                ToolCall(id="c-cancel-queued", name="echo", arguments={"text": "q"}),
            ),
            (
                lonely_gateway,
                "trace-cancel-door",
                ToolCall(id="c-cancel-door", name="echo", arguments={"text": "d"}),
            ),
            (
                gateway,
                "trace-cancel-r",
                ToolCall(id="c-cancel-running", name="slow", arguments={"seconds": 30}),
            ),
        ]
        threads = [
            threading.Thread(target=contextvars.copy_context().run, args=(call, *one)) for one in waiting
        ]
        threads.append(threading.Thread(target=_cancel_each, args=(gateway,)))
        for thread in threads:
            thread.start()
        call(
            gateway,
            "trace-s",
            ToolCall(id="c-healthy", name="echo", arguments={"text": "hi"}),
            ToolCall(id="c-hung", name="stubborn", arguments={"seconds": 30}),
            ToolCall(id="c-crash", name="crash", arguments={"how": "sigkill"}),
            ToolCall(id="c-refused", name="no_such_tool", arguments={}),
            ToolCall(id="c-soft", name="sleepy", arguments={"seconds": 10}),
            ToolCall(id="c-invalid", name="echo", arguments={"times": 2}),
            ToolCall(id="c-denied", name="record_run", arguments={"tag": "t"}),
        )
        # The same failing call again and again: the loop detector blocks it at admission.
        for attempt in range(1, LOOP_CALLS + 1):
            call(
                gateway,
                "trace-loop",
                ToolCall(id=f"c-loop-{attempt}", name="boom", arguments={"message": "x"}),
            )
        for result in asyncio.run(_async_call(ToolGateway(settings))):
            results[result.tool_call_id] = result
        for thread in threads:
            thread.join()
    gateway.close()
    lonely_gateway.close()
    trace.get_tracer_provider().shutdown()  # type: ignore[attr-defined]
    with open(out, "w") as file:
        reasons = {call_id: result.reason for call_id, result in results.items()}
        json.dump({**_ids(agent), "reasons": reasons}, file)


#: Calls of one repeated call (loop detection's critical threshold 2: the third is blocked).
LOOP_CALLS = 3


def _cancel_each(gateway: ToolGateway) -> None:
    """Cancel three calls: two by this gateway (one queued, one running), one through the HTTP door."""
    ledger = gateway._rt.ledger

    def reached(session_key: str, call_id: str, state: str) -> None:
        keys = ledger.keys(session_key, "r1")
        end = time.monotonic() + 30
        while time.monotonic() < end:
            record = ledger.record(keys, call_id)
            if record is not None and record.state.value == state:
                return
            time.sleep(0.05)  # another process's progress: nothing to block on
        raise TimeoutError(f"{call_id} never {state}")

    reached("trace-cancel-q", "c-cancel-queued", "pending")
    gateway.cancel("trace-cancel-q", "r1", "c-cancel-queued")
    reached("trace-cancel-door", "c-cancel-door", "pending")
    request = urllib.request.Request(
        f"http://127.0.0.1:{os.environ['TRACING_HTTP_PORT']}/v1/sessions/trace-cancel-door/runs/r1/cancel",
        data=json.dumps({"call_id": "c-cancel-door"}).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {os.environ['TRACING_HTTP_TOKEN']}",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    reached("trace-cancel-r", "c-cancel-running", "running")
    gateway.cancel("trace-cancel-r", "r1", "c-cancel-running")


async def _async_call(gateway: ToolGateway) -> list[ToolResult]:
    try:
        return await gateway.acall_tools(
            session_key="trace-async", run_id="r1",
            calls=[ToolCall(id="c-async", name="echo", arguments={"text": "async"})],
        )  # fmt: skip
    finally:
        await gateway.aclose()


if __name__ == "__main__":
    provider = TracerProvider(resource=Resource.create({"service.name": "agent"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    mode = sys.argv[2] if len(sys.argv) > 2 else ""
    if mode == "--lost":
        one_call(sys.argv[1], "trace-lost", ToolCall(id="c-lost", name="slow", arguments={"seconds": 60}))
    elif mode == "--requeue":  # an idempotent call whose first attempt hangs: its worker is killed
        arguments = {"tag": sys.argv[4], "first_for_s": 60}
        one_call(
            sys.argv[1], sys.argv[3], ToolCall(id=sys.argv[4], name="record_attempt", arguments=arguments)
        )
    elif mode == "--collect":
        collect(sys.argv[1], sys.argv[3])
    else:
        main(sys.argv[1])
