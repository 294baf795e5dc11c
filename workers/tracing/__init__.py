"""OpenTelemetry spans of every tool call, across the agent's process, the broker and the worker.

Configured the standard way: the OpenTelemetry SDK's ``OTEL_*`` environment variables
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``, ``OTEL_TRACES_EXPORTER``,
``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``, ``OTEL_PROPAGATORS`` ...), or an application that set up
its own tracer provider. Neither: every function here returns at once and nothing of
OpenTelemetry is imported (``pip install 'unstuck[otel]'`` brings the SDK).

The spans, by OpenTelemetry's GenAI conventions:

- ``execute_tool {gen_ai.tool.name}`` (INTERNAL) in the process that called the gateway, a child
  of the caller's current span (a door: of the ``traceparent`` it was given), from submission
  to the answer, with ``gen_ai.operation.name``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``,
  ``gen_ai.tool.type``, ``gen_ai.conversation.id`` (the session), ``unstuck.run_id``; a
  synthetic answer sets status ERROR, ``error.type`` and ``unstuck.reason`` to its reason.
  Its context rides in the task message's headers and is kept in the call's ledger record.
- ``unstuck.run {tool}`` (CONSUMER) in the worker's pool child, a child of that span, with
  ``unstuck.attempt``; a redelivered attempt links the one before. Its span id follows from
  the call and the attempt, so when the child dies (hard limit, crash, out of memory) the
  worker's main process ends the same span, ERROR, with the reason it answered; an attempt
  lost with its worker's host is ended by the gateway that sends the call again.
- ``unstuck.answer {tool}`` (INTERNAL): a synthetic answer written by a process that has no
  span of the call open (the watchdog's ``worker_lost``, a cancel from another gateway), a
  child of the call's span, from the context the ledger kept; ``unstuck.answered_by`` names
  the writer.
- ``unstuck.watchdog.sweep`` and ``unstuck.watchdog.alert {kind}``: the watchdog's own work.

Arguments and results are recorded only when
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` (they may be sensitive).
"""

from workers.tracing.setup import flush, preload
from workers.tracing.spans import (
    CallSpans,
    active,
    alert,
    answer_spans,
    answering_here,
    child_lost,
    collected,
    joined,
    joined_asgi,
    ledger_reader,
    message_headers,
    record_fields,
    requeued,
    run_span,
    span,
    watch_answers,
)

__all__ = [
    "CallSpans",
    "active",
    "alert",
    "answer_spans",
    "answering_here",
    "child_lost",
    "collected",
    "flush",
    "joined",
    "joined_asgi",
    "ledger_reader",
    "message_headers",
    "preload",
    "record_fields",
    "requeued",
    "run_span",
    "span",
    "watch_answers",
]
