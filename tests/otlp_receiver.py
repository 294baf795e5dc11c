"""An OTLP/HTTP trace receiver on loopback for tests: decodes each export with opentelemetry-proto."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the receiver decoded it (ids in lowercase hex, as in a traceparent)."""

    name: str
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: str
    status: str  # UNSET, OK or ERROR
    attributes: dict[str, Any]
    links: list[tuple[str, str]]  # (trace id, span id)
    start_ns: int
    end_ns: int
    client_port: int  # the exporter's end of the connection the span came over


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@dataclass
class Receiver:
    """Spans received so far; ``endpoint`` is what OTEL_EXPORTER_OTLP_ENDPOINT takes."""

    endpoint: str
    spans: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, request: ExportTraceServiceRequest, client_port: int) -> None:
        received: list[ReceivedSpan] = []
        for resource_spans in request.resource_spans:
            service = next(
                (_value(a.value) for a in resource_spans.resource.attributes if a.key == "service.name"), ""
            )
            for scope_spans in resource_spans.scope_spans:
                received.extend(_decoded(span, str(service), client_port) for span in scope_spans.spans)
        with self.lock:
            self.spans.extend(received)

    def named(self, name: str) -> list[ReceivedSpan]:
        with self.lock:
            return [span for span in self.spans if span.name == name]

    def with_call(self, call_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [span for span in self.spans if span.attributes.get("gen_ai.tool.call.id") == call_id]


def _decoded(span: ProtoSpan, service: str, client_port: int) -> ReceivedSpan:
    return ReceivedSpan(
        name=span.name,
        service=service,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex(),
        kind=ProtoSpan.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
        status=Status.StatusCode.Name(span.status.code).removeprefix("STATUS_CODE_"),
        attributes={a.key: _value(a.value) for a in span.attributes},
        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        client_port=client_port,
    )


class _Server(ThreadingHTTPServer):
    # Every export is a connection of its own (HTTP/1.0): with the default backlog of 5, a
    # burst of pool children flushing at once had SYNs dropped and their exports retried
    # seconds later, past a test's wait.
    request_queue_size = 128


@contextmanager
def otlp_receiver(*, keep_alive: bool = False) -> Iterator[Receiver]:
    """A receiver of ``POST /v1/traces`` (protobuf) on a free loopback port, for the block's duration.

    ``keep_alive``: answer in HTTP/1.1 and keep each connection open, as a real collector does.
    """
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            holder[0].add(request, self.client_address[1])
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = _Server(("127.0.0.1", 0), Handler)
    holder.append(Receiver(f"http://127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()
