"""workers.tracing: off and free without OTEL_*, the standard variables when set, spans by the conventions.

Each case runs in a fresh interpreter: a process has one tracer provider, and whether
tracing is on is decided once per process, so nothing here leaks into other tests.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from tests.harness import REPO
from tests.otlp_receiver import otlp_receiver


def _run(code: str, **env: str) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "UNSTUCK_"))}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**clean, "PYTHONPATH": str(REPO), **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The console exporter writes spans to stdout too: the probe's line is marked.
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


_OFF = """
    import json, sys
    import tasks.invoke, workers.servers.http_api, workers.servers.mcp_server
    from workers import ToolCall, tracing
    from workers.core.results import synthetic_result, SyntheticReason
    call = ToolCall(id="c1", name="echo", arguments={})
    with tracing.CallSpans("s", "r", "main", [call]) as spans:
        fields = tracing.record_fields("s", "r", "c1")
        spans.end([synthetic_result(call, SyntheticReason.TIMEOUT_HARD, elapsed_ms=1, attempt=1)])
    with tracing.joined({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}):
        pass
    from opentelemetry import trace
    print("RESULT", json.dumps({
        "active": tracing.active(),
        "fields": fields,
        "sdk_trace": "opentelemetry.sdk.trace" in sys.modules,
        "exporter": any(m.startswith("opentelemetry.exporter") for m in sys.modules),
        "provider": type(trace.get_tracer_provider()).__name__,
    }))
"""


def test_without_otel_variables_nothing_is_set_up_or_recorded() -> None:
    # When the gateway's, worker's and doors' modules are used without any OTEL_* variable
    seen = _run(_OFF)
    # Then no span, no trace context for the ledger, and neither the SDK's tracing nor an exporter loaded
    assert seen == {
        "active": False,
        "fields": {},
        "sdk_trace": False,
        "exporter": False,
        "provider": "ProxyTracerProvider",
    }


@pytest.mark.parametrize(
    ("env", "active"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_the_standard_variables_decide(env: dict[str, str], active: bool) -> None:
    seen = _run(
        """
        import json
        from workers import tracing
        from opentelemetry import trace
        on = tracing.active()
        provider = trace.get_tracer_provider()
        resource = getattr(provider, "resource", None)
        print("RESULT", json.dumps({
            "active": on,
            "provider": type(provider).__name__,
            "service": resource.attributes.get("service.name") if resource else None,
        }))
        """,
        **env,
    )
    expected_provider = "TracerProvider" if active else "ProxyTracerProvider"
    assert seen == {
        "active": active,
        "provider": expected_provider,
        "service": "unstuck" if active else None,
    }


def test_the_service_name_is_the_operators() -> None:
    seen = _run(
        """
        import json
        from workers import tracing
        from opentelemetry import trace
        tracing.active()
        service = trace.get_tracer_provider().resource.attributes["service.name"]
        print("RESULT", json.dumps({"service": service}))
        """,
        OTEL_TRACES_EXPORTER="console",
        OTEL_SERVICE_NAME="my-agents",
    )
    assert seen == {"service": "my-agents"}


_SPANS = """
    import json
    from types import SimpleNamespace
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from workers import ToolCall, tracing
    from workers.core.results import synthetic_result, SyntheticReason
    from workers.core.models import TextBlock, ToolResult
    from workers.errors import LoopDetected

    tracing.active()  # the SDK provider from OTEL_* (the console exporter: stdout unused)
    memory = InMemorySpanExporter()
    trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(memory))
    ok, hung, looped = (ToolCall(id=i, name="echo", arguments={}) for i in ("ok", "hung", "looped"))
    with trace.get_tracer("agent").start_as_current_span("agent") as agent:
        with tracing.CallSpans("s", "r", "main", [ok, hung]) as spans:
            fields = tracing.record_fields("s", "r", "hung")
            headers = tracing.message_headers("s", "r", "hung")
            own = ToolResult(toolCallId="ok", toolName="echo", content=(TextBlock(text="x"),), isError=False)
            spans.end([own, synthetic_result(hung, SyntheticReason.TIMEOUT_HARD, elapsed_ms=5, attempt=1)])
        try:
            with tracing.CallSpans("s", "r", "main", [looped]):
                blocked = synthetic_result(looped, SyntheticReason.LOOP_BLOCKED, elapsed_ms=0, attempt=0)
                error = LoopDetected("ping_pong", 3, "aborted")
                error.results = [blocked]
                raise error
        except LoopDetected:
            pass
    # the worker side: attempt 2 of the hung call, then its child lost (ended by the main process)
    request = SimpleNamespace(**fields)
    keys = SimpleNamespace(session_key="s", run_id="r")
    with tracing.run_span(request, keys, hung, 2, flush=True) as run:
        run.ended(None)
    lost = synthetic_result(hung, SyntheticReason.CRASHED, elapsed_ms=5, attempt=2)
    tracing.child_lost(fields, "s", "r", hung, lost, started_ms=1_700_000_000_000)
    # a gateway started after the caller's died collects the hung call's answer
    gone = synthetic_result(hung, SyntheticReason.WORKER_LOST, elapsed_ms=9, attempt=1)
    tracing.collected(lambda *key: fields, "s", "r", [gone])
    finished = memory.get_finished_spans()
    mine = agent.get_span_context()
    print("RESULT", json.dumps({
        "agent": [format(mine.trace_id, "032x"), format(mine.span_id, "016x")],
        "fields": fields,
        "headers": headers,
        "spans": [
            {
                "name": s.name,
                "kind": s.kind.name,
                "trace": format(s.context.trace_id, "032x"),
                "id": format(s.context.span_id, "016x"),
                "parent": format(s.parent.span_id, "016x") if s.parent else None,
                "status": s.status.status_code.name,
                "attributes": dict(s.attributes),
                "links": [format(link.context.span_id, "016x") for link in s.links],
            }
            for s in finished
        ],
    }))
"""


def test_spans_follow_the_genai_conventions_and_one_attempt_keeps_its_id() -> None:
    seen = _run(_SPANS, OTEL_TRACES_EXPORTER="console")
    trace_id, agent_id = seen["agent"]
    collected = [s for s in seen["spans"] if s["attributes"].get("unstuck.collected")]
    spans = {
        s["name"] + "/" + s["attributes"].get("gen_ai.tool.call.id", ""): s
        for s in seen["spans"]
        if s not in collected
    }
    ok, hung, looped = (
        spans["execute_tool echo/ok"],
        spans["execute_tool echo/hung"],
        spans["execute_tool echo/looped"],
    )
    # The caller's spans: children of its current span, GenAI attributes, status from the answer
    for span in (ok, hung, looped):
        assert (span["kind"], span["trace"], span["parent"]) == ("INTERNAL", trace_id, agent_id)
        assert {
            k: span["attributes"][k]
            for k in ("gen_ai.operation.name", "gen_ai.tool.name", "gen_ai.tool.type")
        } == {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "echo",
            "gen_ai.tool.type": "function",
        }
        assert span["attributes"]["gen_ai.conversation.id"] == "s"
        assert span["attributes"]["unstuck.run_id"] == "r"
        assert "gen_ai.tool.call.arguments" not in span["attributes"]  # opt-in only
    assert ok["status"] == "UNSET"
    assert "error.type" not in ok["attributes"]
    assert (hung["status"], hung["attributes"]["error.type"]) == ("ERROR", "timeout_hard")
    assert (looped["status"], looped["attributes"]["error.type"]) == ("ERROR", "loop_blocked")
    # The ledger record and the message carry the caller's span
    assert seen["fields"] == seen["headers"]
    assert list(seen["fields"]) == ["traceparent"]
    assert seen["fields"]["traceparent"].startswith(f"00-{trace_id}-{hung['id']}-")
    # The worker's attempt 2: a child of the call's span, linking attempt 1; the main process
    # ended a lost child's attempt under the very same span id
    runs = [s for s in seen["spans"] if s["name"] == "unstuck.run echo"]
    assert len(runs) == 2
    child, main = runs
    assert child["id"] == main["id"]
    assert (child["trace"], child["parent"], child["kind"]) == (trace_id, hung["id"], "CONSUMER")
    assert child["attributes"]["unstuck.attempt"] == 2
    assert len(child["links"]) == 1
    assert child["links"][0] != child["id"]
    assert (main["status"], main["attributes"]["error.type"]) == ("ERROR", "crashed")
    assert main["attributes"]["unstuck.answered_by"] == "worker main process"
    # A collected answer: its own execute_tool span, linked to the call's, with its reason
    (late,) = collected
    assert (late["name"], late["links"], late["parent"]) == ("execute_tool echo", [hung["id"]], None)
    assert (late["status"], late["attributes"]["error.type"]) == ("ERROR", "worker_lost")


def test_an_applications_own_provider_turns_it_on_without_otel_variables() -> None:
    seen = _run(
        """
        import json
        import redis  # imports opentelemetry.trace itself: imported is not configured
        from workers import tracing
        before = tracing.active()
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
        print("RESULT", json.dumps({"before": before, "after": tracing.active(),
                                    "kept": trace.get_tracer_provider() is provider}))
        """
    )
    assert seen == {"before": False, "after": True, "kept": True}


_REQUEUED = """
    import json
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from types import SimpleNamespace
    from workers import ToolCall, tracing

    # An application's own provider (random ids of its own): unstuck's spans join it.
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)
    call = ToolCall(id="c1", name="echo", arguments={})
    keys = SimpleNamespace(session_key="s", run_id="r")
    with trace.get_tracer("agent").start_as_current_span("agent"):
        with tracing.CallSpans("s", "r", "main", [call]):
            kept = tracing.record_fields("s", "r", "c1")
    # A gateway that holds no span of the call sends it again with the context the record kept
    headers = tracing.message_headers("s", "r", "c1", {**kept, "state": "pending"})
    none = tracing.message_headers("s", "r", "c1", {"state": "pending"})
    # Its attempt 1 was lost with its worker: the requeue ends it (once), attempt 2 links it
    record = {**kept, "state": "pending", "attempt": "1", "started_ms": "1700000000000"}
    tracing.requeued(record, "s", "r", call, "gateway")
    tracing.requeued(record, "s", "r", call, "gateway")  # a republish since: nothing more
    tracing.requeued({**kept, "state": "pending", "attempt": "0"}, "s", "r", call, "gateway")
    with tracing.run_span(SimpleNamespace(**headers), keys, call, 2, flush=False) as run:
        run.ended(None)

    # A pool child whose answer the worker's main process wrote (a cancel): its span is not sent
    class Ledger:
        def keys(self, session_key, run_id):
            return keys

        def record(self, keys, call_id):
            return SimpleNamespace(fields={**kept, "writer": "host:1/main", "reason": "cancelled"})

    with tracing.run_span(SimpleNamespace(**headers), keys, call, 3, flush=False, ledger=Ledger()) as run:
        run.ended(None)
    runs = [s for s in memory.get_finished_spans() if s.name == "unstuck.run echo"]
    print("RESULT", json.dumps({
        "headers": headers,
        "kept": kept,
        "none": none,
        "runs": [
            {
                "id": format(s.context.span_id, "016x"),
                "parent": format(s.parent.span_id, "016x"),
                "status": s.status.status_code.name,
                "attributes": dict(s.attributes),
                "links": [format(link.context.span_id, "016x") for link in s.links],
            }
            for s in runs
        ],
    }))
"""


def test_a_requeued_attempt_is_ended_and_linked_under_an_applications_provider() -> None:
    seen = _run(_REQUEUED)
    assert seen["headers"] == seen["kept"] != {}
    assert seen["none"] == {}
    caller_span = seen["kept"]["traceparent"].split("-")[2]
    lost, second = seen["runs"]  # attempt 3's span: ended by the main process, not sent twice
    assert (lost["attributes"]["unstuck.attempt"], lost["status"]) == (1, "ERROR")
    assert (lost["attributes"]["error.type"], lost["attributes"]["unstuck.requeued"]) == ("worker_lost", True)
    assert lost["parent"] == second["parent"] == caller_span
    assert second["attributes"]["unstuck.attempt"] == 2
    assert second["links"] == [lost["id"]]
    assert second["attributes"]["unstuck.late"] is True


def test_a_flush_to_a_collector_that_never_answers_holds_its_caller_only_its_wait() -> None:
    # Given a collector that takes connections and never answers (nothing accepts them)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        # When a process with a span to send flushes, waiting 0.5 s
        seen = _run(
            """
            import json, time
            from workers import tracing
            from workers.tracing.setup import tracer
            tracing.active()
            tracer().start_span("unstuck.run probe").end()
            started = time.monotonic()
            tracing.flush(wait_s=0.5)
            print("RESULT", json.dumps({"waited_s": time.monotonic() - started}))
            """,
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
            OTEL_EXPORTER_OTLP_TIMEOUT="8",
        )
    # Then it went on after its wait, not after the exporter's 8 s timeout
    assert 0.4 <= seen["waited_s"] < 2.0, seen


def test_a_forking_process_leaves_its_children_no_import_to_make_on_an_export() -> None:
    # Given a collector, and a process that prepared tracing before forking a pool
    with otlp_receiver() as receiver:
        # When it sends its first span
        seen = _run(
            """
            import json, sys
            from workers import tracing
            from workers.tracing.setup import STATE, tracer
            tracing.preload()
            before = set(sys.modules)
            tracer().start_span("probe").end()
            tracing.flush(wait_s=10)
            print("RESULT", json.dumps({
                "configured": STATE.configured, "imported": sorted(set(sys.modules) - before),
            }))
            """,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        )
        # Then the export imported nothing: a child forked while an export thread imports a
        # module inherits that module's import lock held, and hangs on its own first export
        assert seen == {"configured": True, "imported": []}
        assert [span.name for span in receiver.spans] == ["probe"]


def test_a_forked_child_sends_its_spans_on_a_connection_of_its_own() -> None:
    # Given a collector that keeps connections open, and a process that sent a span before forking
    with otlp_receiver(keep_alive=True) as receiver:
        # When its forked child sends a span, and then the parent another
        _run(
            """
            import os
            from workers import tracing
            from workers.tracing.setup import tracer

            def send(name):
                tracer().start_span(name).end()
                tracing.flush(wait_s=10)

            tracing.preload()
            send("parent before")
            child = os.fork()
            if child == 0:
                send("child")
                os._exit(0)
            os.waitpid(child, 0)
            send("parent after")
            print("RESULT {}")
            """,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        )
        ports = {span.name: span.client_port for span in receiver.spans}
    # Then every span arrived, the child's on its own connection: on the parent's pooled one,
    # their requests would interleave and each could read the other's reply
    assert sorted(ports) == ["child", "parent after", "parent before"]
    assert ports["child"] not in (ports["parent before"], ports["parent after"]), ports
