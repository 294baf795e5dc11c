"""The spans of tool calls (see :mod:`workers.tracing` for which and where)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from workers.core.models import SyntheticReason, ToolCall, ToolResult
from workers.tracing import setup
from workers.tracing.setup import capture_content, flush, start_with_id, tracer

if TYPE_CHECKING:  # typing only: this module imports OpenTelemetry when tracing is on, never before
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

__all__ = [
    "CallSpans",
    "active",
    "alert",
    "answer_spans",
    "child_lost",
    "collected",
    "joined",
    "joined_asgi",
    "ledger_reader",
    "message_headers",
    "record_fields",
    "requeued",
    "run_span",
    "span",
    "watch_answers",
]

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_CARRIER_KEYS = (TRACEPARENT, TRACESTATE)

#: Answers the worker's main process writes when the pool child that ran the call is gone.
_CHILD_GONE = frozenset(
    {SyntheticReason.TIMEOUT_HARD.value, SyntheticReason.CRASHED.value, SyntheticReason.OUT_OF_MEMORY.value}
)

CallKey = tuple[str, str, str]  # session, run, call id

#: How the worker's main process signs the answers it writes (``{worker id}/main``).
_MAIN_PROCESS_WRITER = "/main"

#: Lost attempts whose span this process ended when their call was requeued (oldest first).
_REQUEUED: dict[tuple[str, int, int], None] = {}
_REQUEUED_KEPT = 4096


# The spans of calls this process has open (its ``execute_tool`` or ``unstuck.run``): an
# answer this process writes for one of them is recorded on that span, not on a new one.
_OPEN: dict[CallKey, _OpenCall] = {}


_UNKNOWN = object()


def active() -> bool:
    """Whether spans are recorded: ``OTEL_*`` configured, or the application's own provider set.

    Costs a dictionary look-up when neither (OpenTelemetry is then never imported), and enters
    :mod:`workers.tracing.setup` only to decide it first, or to configure the SDK.
    """
    state = setup.STATE
    if state.env is None:
        state.env = setup.env_configured()
    if state.env:
        if not state.configured:
            setup.configure()
        return True
    otel_trace = sys.modules.get("opentelemetry.trace")
    if otel_trace is None:
        return False
    # Imported does not mean used (redis-py imports it): the API's global stays None until an
    # application sets a provider, and reading it spares get_tracer_provider()'s environment
    # look-up on every call.
    provider = getattr(otel_trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is None:
        return False
    if provider is _UNKNOWN:
        provider = otel_trace.get_tracer_provider()
    return not isinstance(provider, otel_trace.ProxyTracerProvider | otel_trace.NoOpTracerProvider)


# -- the caller's side: execute_tool ----------------------------------------------------------


class _OpenCall:
    """One call's ``execute_tool`` (or ``unstuck.run``) span while this process has it open."""

    __slots__ = ("answered_here", "carrier", "span")

    def __init__(self, span: Span, carrier: dict[str, str]) -> None:
        self.span = span
        self.carrier = carrier
        self.answered_here = False


def _carrier_of(span: Span) -> dict[str, str]:
    from opentelemetry import trace
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier, context=trace.set_span_in_context(span))
    return {k: v for k, v in carrier.items() if k in _CARRIER_KEYS}


def _end_with(span: Span, result: ToolResult | None, *, error: str | None = None) -> None:
    from opentelemetry.trace import StatusCode

    reason = error
    if result is not None:
        if result.synthetic:
            reason = result.reason or "synthetic"
            span.set_attribute("unstuck.reason", reason)
        elif result.is_error:
            reason = SyntheticReason.TOOL_ERROR.value
        if capture_content():
            span.set_attribute("gen_ai.tool.call.result", result.text)
    if reason is not None:
        span.set_attribute("error.type", reason)
        span.set_status(StatusCode.ERROR, reason)
    span.end()


def _tool_attributes(call: ToolCall, session_key: str, run_id: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.id,
        "gen_ai.tool.type": "function",
        "gen_ai.conversation.id": session_key,
        "unstuck.run_id": run_id,
    }
    if capture_content():
        attributes["gen_ai.tool.call.arguments"] = json.dumps(call.arguments, default=str)
    return attributes


class CallSpans:
    """The ``execute_tool`` spans of one batch, open from submission until its answers.

    Use as a context manager around submitting and waiting; :meth:`end` with the results.
    A ``LoopDetected`` (or any error carrying ``results``) ends each span with its call's
    result; another error ends them with its class name as ``error.type``.
    """

    __slots__ = ("_agent_id", "_calls", "_keys", "_run_id", "_session_key")

    def __init__(self, session_key: str, run_id: str, agent_id: str, calls: Sequence[ToolCall]) -> None:
        self._keys: list[CallKey] = []
        self._session_key = session_key
        self._run_id = run_id
        self._agent_id = agent_id
        self._calls = calls

    def __enter__(self) -> CallSpans:
        if not active():
            return self
        calls_tracer = tracer()
        for call in self._calls:
            key = (self._session_key, self._run_id, call.id)
            if key in _OPEN:
                continue  # the same id twice in a batch (or in flight already): one span
            attributes = _tool_attributes(call, self._session_key, self._run_id)
            attributes["unstuck.agent_id"] = self._agent_id
            span = calls_tracer.start_span(f"execute_tool {call.name}", attributes=attributes)
            _OPEN[key] = _OpenCall(span, _carrier_of(span))
            self._keys.append(key)
        return self

    def end(self, results: Sequence[ToolResult]) -> list[ToolResult]:
        """End each span with its call's result; returns ``results``."""
        if not self._keys:
            return list(results)  # nothing traced (tracing off, or every call traced already)
        by_id = {result.tool_call_id: result for result in results}
        for key in self._keys:
            opened = _OPEN.pop(key, None)
            if opened is None:
                continue
            result = by_id.get(key[2])
            if opened.answered_here and (result is None or result.synthetic):
                opened.span.set_attribute("unstuck.answered_by", "gateway")
            elif result is not None and not result.synthetic:
                opened.span.set_attribute("unstuck.answered_by", "worker")
            _end_with(opened.span, result, error=None if result is not None else "no_result")
        self._keys = []
        return list(results)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, *_: object) -> None:
        if not self._keys:
            return
        results = getattr(exc, "results", None)
        if isinstance(results, list) and all(isinstance(r, ToolResult) for r in results):
            self.end(results)
            return
        for key in self._keys:
            opened = _OPEN.pop(key, None)
            if opened is not None:
                error = exc_type.__name__ if exc_type is not None else "no_result"
                _end_with(opened.span, None, error=error)
        self._keys = []


def collected(
    read: RecordReader | None, session_key: str, run_id: str, results: Sequence[ToolResult]
) -> list[ToolResult]:
    """``execute_tool`` spans of calls a caller collected (submitted by a gateway gone since).

    Each is a child of the collector's current span, linked to the call's own span when its
    ledger record kept one (``read``), and ends at once with the collected answer.
    """
    if not results or not active():
        return list(results)
    from opentelemetry.trace import Link

    for result in results:
        key = (session_key, run_id, result.tool_call_id)
        if key in _OPEN:
            continue  # this process's own call, traced already
        fields = _read_fields(read, key)
        links = []
        if fields is not None:
            from opentelemetry import trace

            original = trace.get_current_span(_parent(fields)).get_span_context()
            links.append(Link(original))
        call = ToolCall(id=result.tool_call_id, name=result.tool_name, arguments={})
        attributes = {**_tool_attributes(call, session_key, run_id), "unstuck.collected": True}
        span = tracer().start_span(f"execute_tool {call.name}", attributes=attributes, links=links)
        _end_with(span, result)
    return list(results)


def record_fields(session_key: str, run_id: str, call_id: str) -> dict[str, str]:
    """The trace context the call's ledger record keeps (``{}`` when the call is not traced)."""
    if not _OPEN:
        return {}
    opened = _OPEN.get((session_key, run_id, call_id))
    return {} if opened is None else dict(opened.carrier)


def message_headers(
    session_key: str, run_id: str, call_id: str, kept: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The headers a call's task message carries (``traceparent``, ``tracestate``), or ``{}``.

    ``kept``: the call's ledger record, for a message sent again by a process that holds no
    span of the call (a gateway collecting the run of one that died): the context it kept.
    """
    if not _OPEN and not kept:
        return {}  # no span open in this process (always so when tracing is off)
    headers = record_fields(session_key, run_id, call_id)
    if headers or not kept or not kept.get(TRACEPARENT):
        return headers
    return {k: kept[k] for k in _CARRIER_KEYS if kept.get(k)}


# -- the doors: join the caller's trace -------------------------------------------------------


@contextlib.contextmanager
def _attached(carrier: Mapping[str, str]) -> Iterator[None]:
    from opentelemetry import context
    from opentelemetry.propagate import extract

    token = context.attach(extract(dict(carrier)))
    try:
        yield
    finally:
        context.detach(token)


def joined(carrier: Mapping[str, Any] | None) -> contextlib.AbstractContextManager[None]:
    """Make the trace context in ``carrier`` (``traceparent``/``tracestate``) current while open.

    For MCP ``params._meta`` and any mapping of headers; nothing when tracing is off or the
    carrier holds no ``traceparent``.
    """
    if carrier is None or not active():
        return contextlib.nullcontext()
    found = {k: v for k in _CARRIER_KEYS if isinstance(v := carrier.get(k), str)}
    return _attached(found) if TRACEPARENT in found else contextlib.nullcontext()


def joined_asgi(headers: Mapping[bytes, str]) -> contextlib.AbstractContextManager[None]:
    """:func:`joined` for an ASGI request's headers (lowercase bytes names, decoded values)."""
    if not active():
        return contextlib.nullcontext()
    return joined({name: value for name in _CARRIER_KEYS if (value := headers.get(name.encode()))})


# -- the worker's side: unstuck.run ------------------------------------------------------------


def _attempt_span_id(carrier: Mapping[str, str], call_id: str, attempt: int) -> int:
    """The span id of one attempt: the same in the child that runs it and the process that ends it."""
    seed = f"{carrier.get(TRACEPARENT, '')}|{call_id}|{attempt}".encode()
    return int.from_bytes(hashlib.sha256(seed).digest()[:8], "big") or 1


def _parent(carrier: Mapping[str, str]) -> Context:
    from opentelemetry.propagate import extract

    return extract(dict(carrier))


def _attempt_span(
    carrier: Mapping[str, str], call: ToolCall, session_key: str, run_id: str, attempt: int, **options: Any
) -> Span:
    from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags

    parent = _parent(carrier)
    links = []
    if attempt > 1 and TRACEPARENT in carrier:
        from opentelemetry import trace

        caller = trace.get_current_span(parent).get_span_context()
        earlier = SpanContext(
            caller.trace_id,
            _attempt_span_id(carrier, call.id, attempt - 1),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        links.append(Link(NonRecordingSpan(earlier).get_span_context(), {"unstuck.attempt": attempt - 1}))
    attributes = _tool_attributes(call, session_key, run_id)
    attributes["unstuck.attempt"] = attempt
    return start_with_id(
        f"unstuck.run {call.name}",
        _attempt_span_id(carrier, call.id, attempt),
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        links=links,
        **options,
    )


class _RunSpan:
    """The open ``unstuck.run`` span of a claimed call in the pool child."""

    def __init__(self, key: CallKey | None, *, flush: bool = False, read: RecordReader | None = None) -> None:
        self._key = key
        self._flush = flush
        self._read = read

    def ended(self, result: ToolResult | None) -> ToolResult | None:
        """End the span with the answer the ledger took (None: another writer's answer won)."""
        opened = _OPEN.pop(self._key, None) if self._key is not None else None
        if opened is not None:
            sent = True
            if result is not None:
                opened.span.set_attribute("unstuck.answered_by", "worker")
                _end_with(opened.span, result)
            else:
                sent = self._ended_late(opened.span)
            if sent and self._flush:
                # Sent now, once the answer is stored: the pool child may die on its next
                # call (a crash, a hard limit) and take what it had not sent with it.
                flush()
        self._key = None
        return result

    def _ended_late(self, span: Span) -> bool:
        """End the span of a run whose answer another writer stored first; False: ended already.

        The worker's main process answers for a child it interrupts (a cancel past its grace,
        a silent heartbeat) and ends this attempt's span itself, under the same id: a second
        span of that id is not sent. Any other writer's answer (a deadline, the watchdog) is
        the call's: the span ends with its reason, marked late.
        """
        fields = _read_fields(self._read, self._key) if self._key is not None else None
        if fields is not None and fields.get("writer", "").endswith(_MAIN_PROCESS_WRITER):
            return False
        span.set_attribute("unstuck.late", True)
        reason = fields.get("reason") if fields is not None else None
        _end_with(span, None, error=reason or None)
        return True

    def abandon(self, exc: BaseException | None) -> None:
        opened = _OPEN.pop(self._key, None) if self._key is not None else None
        if opened is not None:
            _end_with(opened.span, None, error=type(exc).__name__ if exc is not None else "no_result")


# What the pool child gets when tracing is off: no generator and no span object per call.
_RUN_UNTRACED = contextlib.nullcontext(_RunSpan(None))


def run_span(
    request: object, keys: Any, call: ToolCall, attempt: int, *, flush: bool, ledger: Any = None
) -> contextlib.AbstractContextManager[_RunSpan]:
    """The pool child's ``unstuck.run`` span of a claimed call, parent from the message headers.

    ``request`` is the Celery task's request (its message headers as attributes), ``keys``
    the run's (session and run id); ``flush``: send the span as soon as it ends; ``ledger``
    (a sync ``Ledger``): read who answered when another writer's answer came first.
    """
    if not active():
        return _RUN_UNTRACED
    return _traced_run(request, keys, call, attempt, flush=flush, ledger=ledger)


@contextlib.contextmanager
def _traced_run(
    request: object, keys: Any, call: ToolCall, attempt: int, *, flush: bool, ledger: Any
) -> Iterator[_RunSpan]:
    session_key, run_id = keys.session_key, keys.run_id
    carrier = {k: v for k in _CARRIER_KEYS if isinstance(v := getattr(request, k, None), str)}
    span = _attempt_span(carrier, call, session_key, run_id, attempt)
    key = (session_key, run_id, call.id)
    _OPEN[key] = _OpenCall(span, carrier)
    run = _RunSpan(key, flush=flush, read=None if ledger is None else ledger_reader(ledger))
    try:
        yield run
    except BaseException as exc:
        run.abandon(exc)
        raise
    run.abandon(None)


def child_lost(
    fields: Mapping[str, str] | None,
    session_key: str,
    run_id: str,
    call: ToolCall,
    answer: ToolResult,
    started_ms: int,
    answered_by: str = "worker main process",
) -> None:
    """End the ``unstuck.run`` span of a pool child that died, from the worker's main process.

    ``fields`` is the call's ledger record (its kept trace context); the span gets the id the
    child's own had, started when the attempt was claimed, status ERROR with the answer's reason.
    The watchdog ends a lost worker's attempt the same way (``answered_by``).
    """
    if fields is None or not active():
        return
    carrier = {k: fields[k] for k in _CARRIER_KEYS if fields.get(k)}
    attempt = int(answer.details.get("attempt") or 1)
    start_ns = started_ms * 1_000_000 if started_ms else None
    span = _attempt_span(carrier, call, session_key, run_id, attempt, start_time=start_ns)
    span.set_attribute("unstuck.answered_by", answered_by)
    _end_with(span, answer)


def requeued(
    fields: Mapping[str, str] | None, session_key: str, run_id: str, call: ToolCall, role: str
) -> None:
    """End the span of the attempt a lost worker took with it, when its call goes back to the queue.

    ``fields``: the call's ledger record as the requeue left it (pending, the lost attempt's
    number and start). Nobody answered that attempt and its child is gone with its host: the
    span ends here, under its own id, ERROR ``worker_lost``, ``unstuck.requeued`` true. The
    next attempt's span links it. A message sent again for a call nobody claimed ends nothing.
    """
    if not fields or not fields.get(TRACEPARENT) or fields.get("state") != "pending" or not active():
        return
    attempt, started_ms = int(fields.get("attempt") or 0), int(fields.get("started_ms") or 0)
    if not attempt or not started_ms or (call.id, attempt, started_ms) in _REQUEUED:
        return  # never claimed, or this attempt's span ended here already (a republish since)
    if len(_REQUEUED) >= _REQUEUED_KEPT:
        _REQUEUED.pop(next(iter(_REQUEUED)))
    _REQUEUED[(call.id, attempt, started_ms)] = None
    carrier = {k: fields[k] for k in _CARRIER_KEYS if fields.get(k)}
    span = _attempt_span(carrier, call, session_key, run_id, attempt, start_time=started_ms * 1_000_000)
    span.set_attribute("unstuck.requeued", True)
    span.set_attribute("unstuck.requeued_by", role)
    _end_with(span, None, error=SyntheticReason.WORKER_LOST.value)


# -- answers written without a span of the call ------------------------------------------------


RecordReader = Callable[[str, str, str], Mapping[str, str] | None]


def answering_here(session_key: str, run_id: str, call_id: str) -> None:
    """Mark a call this process is about to answer, when its ``execute_tool`` span is open here.

    Before the write, not after it: the call's waiter (another thread) may read the answer and
    end the span before the writer's ``on_answered`` listener runs. A write that loses to the
    worker's real result leaves the mark unread (:meth:`CallSpans.end` checks the result).
    """
    opened = _OPEN.get((session_key, run_id, call_id))
    if opened is not None:
        opened.answered_here = True


def answer_spans(role: str, read: RecordReader | None) -> Callable[[Any, ToolResult], None]:
    """A ledger ``on_answered`` listener: a span for each synthetic answer this process wrote.

    An answer to a call with a span open here is recorded on that span; any other is an
    ``unstuck.answer`` span under the context the call's record kept (``read`` gives the
    record's fields by session, run and call id; None: only calls open here). A pool child's
    loss, answered by the worker's main process, ends the child's ``unstuck.run`` instead.
    """

    def answered(keys: Any, result: ToolResult) -> None:
        if not result.synthetic or not active():
            return
        key = (keys.session_key, keys.run_id, result.tool_call_id)
        opened = _OPEN.get(key)
        if opened is not None:
            opened.answered_here = True
            if result.reason != SyntheticReason.WORKER_LOST.value:
                return  # recorded on the open span; a lost worker's attempt still needs ending
        fields = _read_fields(read, key)
        if fields is None:
            return
        if opened is not None:
            _end_lost_attempt(fields, key, result, role)
        else:
            _answer_span(fields, key, result, role)

    return answered


def _read_fields(read: RecordReader | None, key: CallKey) -> Mapping[str, str] | None:
    """The call record's fields when they hold a trace context, else None."""
    if read is None:
        return None
    try:
        fields = read(*key)
    except Exception as exc:  # noqa: BLE001 - a span is never a reason to fail an answer
        log.debug("trace context of %s not read: %s", key[2], exc)
        return None
    return fields if fields and fields.get(TRACEPARENT) else None


def _end_lost_attempt(fields: Mapping[str, str], key: CallKey, result: ToolResult, role: str) -> None:
    started_ms = int(fields.get("started_ms") or 0)
    if result.reason == SyntheticReason.WORKER_LOST.value and started_ms:
        # The worker went with its pool child: nobody else ends the attempt's span.
        call = ToolCall(id=key[2], name=result.tool_name, arguments={})
        child_lost(fields, key[0], key[1], call, result, started_ms, answered_by=role)


def _answer_span(fields: Mapping[str, str], key: CallKey, result: ToolResult, role: str) -> None:
    call = ToolCall(id=key[2], name=result.tool_name, arguments={})
    carrier = {k: fields[k] for k in _CARRIER_KEYS if fields.get(k)}
    if result.reason in _CHILD_GONE:
        child_lost(fields, key[0], key[1], call, result, int(fields.get("started_ms") or 0))
        return
    _end_lost_attempt(fields, key, result, role)
    attributes = _tool_attributes(call, key[0], key[1])
    attributes["unstuck.answered_by"] = role
    span = tracer().start_span(f"unstuck.answer {call.name}", context=_parent(carrier), attributes=attributes)
    _end_with(span, result)


def watch_answers(ledger: Any, role: str) -> None:
    """Trace the synthetic answers stored through ``ledger`` (a sync ``Ledger``; see :func:`answer_spans`)."""
    ledger.on_answered.append(answer_spans(role, ledger_reader(ledger)))


def ledger_reader(ledger: Any) -> RecordReader:
    """A :data:`RecordReader` on a sync ``Ledger``."""

    def read(session_key: str, run_id: str, call_id: str) -> Mapping[str, str] | None:
        record = ledger.record(ledger.keys(session_key, run_id), call_id)
        return None if record is None else record.fields

    return read


# -- any other span (the watchdog's sweeps and alerts) ----------------------------------------


@contextlib.contextmanager
def _span(name: str, attributes: Mapping[str, Any]) -> Iterator[Callable[[str, Any], None]]:
    with tracer().start_as_current_span(name, attributes=dict(attributes)) as opened:
        yield opened.set_attribute


def _ignore(_name: str, _value: Any) -> None:
    return None


@contextlib.contextmanager
def span(name: str, **attributes: Any) -> Iterator[Callable[[str, Any], None]]:
    """A span around a block, current while open; yields a setter of more attributes."""
    if not active():
        yield _ignore
        return
    with _span(name, attributes) as set_attribute:
        yield set_attribute


def alert(event: Mapping[str, Any]) -> None:
    """An ``unstuck.watchdog.alert {kind}`` span for a watchdog alert (its scalar fields as attributes)."""
    if not active():
        return
    attributes = {
        f"unstuck.alert.{name}": value
        for name, value in event.items()
        if isinstance(value, str | int | float | bool) and name != "kind"
    }
    tracer().start_span(f"unstuck.watchdog.alert {event.get('kind', 'alert')}", attributes=attributes).end()
