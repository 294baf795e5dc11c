"""Whether spans are recorded and where they go: the OpenTelemetry SDK set up from ``OTEL_*``.

The standard variables are OpenTelemetry's contract, not unstuck settings: they are read
here, once per process, and by the SDK itself (exporter endpoint, headers, sampler, batching).
Nothing of OpenTelemetry is imported until they ask for traces, or until the application
installed a tracer provider of its own (then that one is used, never replaced).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # typing only: OpenTelemetry is imported when tracing is on, never before
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "STATE",
    "capture_content",
    "configure",
    "env_configured",
    "flush",
    "preload",
    "start_with_id",
    "tracer",
]

log = logging.getLogger(__name__)

_EXPORT_DELAY_MS = 200


def env_configured() -> bool:
    """Whether the ``OTEL_*`` variables ask for traces (read once per process)."""
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER")
    if exporters is not None:
        return exporters.strip().lower() not in ("", "none")
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


class _State:
    """The process's tracing state: decided once from the environment, configured on first use."""

    def __init__(self) -> None:
        self.env: bool | None = None
        self.configured = False
        self.lock = threading.Lock()
        self.tracer: Tracer | None = None


STATE = _State()
# Set while a span with a chosen id is started (see _ChosenIds).
_CHOSEN_SPAN_ID: ContextVar[int | None] = ContextVar("unstuck_chosen_span_id", default=None)


#: What configuring from ``OTEL_*`` and the first export import (the exporter's HTTP
#: transport imports requests when it is built; requests imports netrc and shlex on its
#: first request).
_SDK_MODULES = (
    "opentelemetry.trace",
    "opentelemetry.propagate",
    "opentelemetry.sdk.resources",
    "opentelemetry.sdk.trace",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk.trace.id_generator",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "requests",
    "netrc",
    "shlex",
)


def preload() -> None:
    """Import and configure what tracing needs, in a process about to fork a pool.

    On the main thread, before the pool forks: a child forked while another thread of its
    parent imports a module (the main process's first export imports netrc) inherits that
    module's import lock held, and hangs on its own first export importing it; forked while
    another thread configures, it inherits the configuring lock held. A pool child's first
    span would also spend the imports (over a second on a loaded machine) in its call's
    time limit. Every child inherits the provider: the SDK starts its
    batch thread again in the child, and the exporter is made again there
    (:mod:`workers.tracing.exporter_per_process`). Nothing when ``OTEL_*`` asks for no traces.
    """
    state = STATE
    if state.env is None:
        state.env = env_configured()
    if not state.env:
        return
    import importlib

    for name in _SDK_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # reported by configure (see _sdk_provider)
            continue
    configure()


def configure() -> None:
    """Install the SDK's tracer provider from the ``OTEL_*`` variables (unless one is installed)."""
    with STATE.lock:
        if STATE.configured:
            return
        from opentelemetry import trace

        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            provider = _sdk_provider()
            if provider is not None:
                trace.set_tracer_provider(provider)
        STATE.configured = True


def _sdk_provider() -> Any:
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("OTEL_* is set but the OpenTelemetry SDK is not installed: pip install 'unstuck[otel]'")
        return None
    attributes = {}
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        attributes[SERVICE_NAME] = "unstuck"
    # Sampler (OTEL_TRACES_SAMPLER), span limits and batching (OTEL_BSP_*) come from the
    # environment through the SDK's own defaults, but for the export delay when it is not set:
    # a pool child may crash right after its previous call, and what it held unsent dies
    # with it. 200 ms instead of the SDK's 5 s keeps that window short; a flush after every
    # call (worker.flush_spans_each_call, on by default) closes it at about 2 ms of worker CPU a call.
    delay_ms = None if os.environ.get("OTEL_BSP_SCHEDULE_DELAY") else _EXPORT_DELAY_MS
    from workers.tracing.exporter_per_process import ExporterPerProcess

    provider = TracerProvider(resource=Resource.create(attributes))
    for make in _exporters():
        processor = BatchSpanProcessor(ExporterPerProcess(make), schedule_delay_millis=delay_ms)
        provider.add_span_processor(processor)
    return provider


def _exporters() -> list[Callable[[], Any]]:
    """How to make each exporter ``OTEL_TRACES_EXPORTER`` names (again in each forked child)."""
    names = [n.strip().lower() for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    makers: list[Callable[[], Any]] = []
    for name in filter(None, names):
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            makers.append(ConsoleSpanExporter)
        elif name == "otlp":
            makers.append(_otlp_exporter)
        else:
            log.warning("OTEL_TRACES_EXPORTER=%s: unstuck knows otlp and console; ignored", name)
    return makers


def _otlp_exporter() -> Any:
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    )
    if protocol.strip() == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            log.warning("OTLP over gRPC needs opentelemetry-exporter-otlp-proto-grpc; sending http/protobuf")
        else:
            return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # Endpoint, headers, timeout and compression: the exporter reads OTEL_EXPORTER_OTLP_*.
    return OTLPSpanExporter()


def _chosen_ids(fallback: Any) -> Any:
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class _ChosenIds(IdGenerator):
        """The ``fallback``'s ids, but the span id :func:`start_with_id` chose when one is set."""

        def generate_span_id(self) -> int:
            chosen = _CHOSEN_SPAN_ID.get()
            return chosen if chosen is not None else int(fallback.generate_span_id())

        def generate_trace_id(self) -> int:
            return int(fallback.generate_trace_id())

        def is_trace_id_random(self) -> bool:
            return bool(getattr(fallback, "is_trace_id_random", lambda: False)())

    return _ChosenIds()


def tracer() -> Tracer:
    """The tracer of unstuck's spans, from the installed provider (an application's own too).

    An SDK tracer's ids come from its own id generator: unstuck's tracer gets one that honours
    :func:`start_with_id` (a span ended by another process than the one that started it has
    the same id), and otherwise draws from the provider's generator.
    """
    tracer = STATE.tracer
    if tracer is None:
        from opentelemetry import trace

        tracer = trace.get_tracer("unstuck")
        fallback = getattr(tracer, "id_generator", None)
        if fallback is not None:
            tracer.id_generator = _chosen_ids(fallback)  # type: ignore[attr-defined]
        STATE.tracer = tracer
    return tracer


def capture_content() -> bool:
    """Whether arguments and results go into spans (opt-in: they may be sensitive)."""
    return os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").lower() == "true"


def start_with_id(name: str, span_id: int, **options: Any) -> Span:
    """Start a span whose id is ``span_id`` (with the provider ``active()`` installed)."""
    token = _CHOSEN_SPAN_ID.set(span_id)
    try:
        return tracer().start_span(name, **options)
    finally:
        _CHOSEN_SPAN_ID.reset(token)


#: How long a pool child waits for its spans to be sent after each call (worker.flush_spans_each_call).
FLUSH_WAIT_S = 1.0


def flush(wait_s: float = FLUSH_WAIT_S) -> None:
    """Send what the provider holds now, on this process's flush thread; wait for it ``wait_s`` at most.

    The SDK's ``force_flush`` exports in its caller's thread and waits for the exporter's own
    timeout (10 s by default, its retries included), whatever timeout it is given. A slow or
    unreachable collector held a pool child that long after every call, and a soft time limit
    cut the export short and dropped its spans. On a thread of its own the export goes on after
    the wait ends: the spans are sent once the collector takes them, as the batch would have.
    """
    _FLUSHER.flush(wait_s)


class _Flusher:
    """One thread per process that runs ``force_flush`` for the callers of :func:`flush`.

    Each request is served by a flush that starts after it, so the spans ended before the
    request are in it; requests that come during one flush share the next.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._requested = 0
        self._done = 0
        self._thread: threading.Thread | None = None

    def flush(self, wait_s: float) -> None:
        with self._cond:
            self._requested += 1
            wanted = self._requested
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="unstuck-span-flush", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._done >= wanted, timeout=wait_s)

    def _run(self) -> None:
        from opentelemetry import trace

        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._requested > self._done)
                serving = self._requested
            force_flush = getattr(trace.get_tracer_provider(), "force_flush", None)
            try:
                if force_flush is not None:
                    force_flush()
            except Exception:  # a failed export must not end the thread
                log.warning("spans not sent", exc_info=True)
            with self._cond:
                self._done = serving
                self._cond.notify_all()

    def forget_in_child(self) -> None:
        """A forked child has no flush thread of its parent's, nor its lock's state."""
        self._cond = threading.Condition()
        self._requested = self._done = 0
        self._thread = None


_FLUSHER = _Flusher()
os.register_at_fork(after_in_child=_FLUSHER.forget_in_child)
