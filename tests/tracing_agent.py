"""An agent process for the tracing e2e test: one agent span around calls of every outcome.

Run as ``python -m tests.tracing_agent OUT.json`` with the OTEL_* variables set (``--lost``:
one long call, the ids written before it; the test kills this process and the worker). The agent
sets up its own tracer provider (as an application would); unstuck's spans join it. Writes
the agent span's ids and each call's reason (None: the tool's own result) to OUT.json.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import sys
import threading

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


def lost(out: str) -> None:
    """One call that outlives this process: the test kills it and the worker running it."""
    gateway = ToolGateway(load_settings())
    with trace.get_tracer("agent").start_as_current_span("agent") as agent:
        with open(out, "w") as file:
            json.dump(_ids(agent), file)
        gateway.call_tools(
            session_key="trace-lost", run_id="r1",
            calls=[ToolCall(id="c-lost", name="slow", arguments={"seconds": 60})],
        )  # fmt: skip


def main(out: str) -> None:
    settings = load_settings()
    gateway = ToolGateway(settings)
    # Each run its own session (a session's new run supersedes its older one).
    # A queue no worker reads: its call is answered deadline_exceeded by the gateway.
    nobody = settings.model_copy(update={"broker": settings.broker.model_copy(update={"queue": "nobody"})})
    lonely_gateway = ToolGateway(nobody)
    results: dict[str, ToolResult] = {}
    with trace.get_tracer("agent").start_as_current_span("agent") as agent:
        # A thread starts with no context: it is given the agent's (as an application would).
        lonely = threading.Thread(
            target=contextvars.copy_context().run,
            args=(
                lambda: results.update(
                (r.tool_call_id, r)
                for r in lonely_gateway.call_tools(
                    session_key="trace-deadline", run_id="r1",
                    calls=[ToolCall(id="c-deadline", name="echo", arguments={"text": "x"})],
                )
            ),),
        )  # fmt: skip
        lonely.start()
        calls = [
            ToolCall(id="c-healthy", name="echo", arguments={"text": "hi"}),
            ToolCall(id="c-hung", name="stubborn", arguments={"seconds": 30}),
            ToolCall(id="c-crash", name="crash", arguments={"how": "sigkill"}),
            ToolCall(id="c-refused", name="no_such_tool", arguments={}),
        ]
        for result in gateway.call_tools(session_key="trace-s", run_id="r1", calls=calls):
            results[result.tool_call_id] = result
        for result in asyncio.run(_async_call(ToolGateway(settings))):
            results[result.tool_call_id] = result
        lonely.join()
    gateway.close()
    lonely_gateway.close()
    trace.get_tracer_provider().shutdown()  # type: ignore[attr-defined]
    with open(out, "w") as file:
        reasons = {call_id: result.reason for call_id, result in results.items()}
        json.dump({**_ids(agent), "reasons": reasons}, file)


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
    (lost if "--lost" in sys.argv else main)(sys.argv[1])
