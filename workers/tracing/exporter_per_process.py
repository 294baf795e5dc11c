"""A span exporter made anew in each process that exports through it: one per pool child.

The worker's main process sets its tracer provider up before it forks the pool, and every
child inherits it. The SDK's batch processor starts its thread again in a child, but the
exporter is the parent's object: its HTTP session holds the parent's pooled keep-alive
connections (a child sending on the parent's socket interleaves their requests and misreads
their replies) and the locks its parent's export thread may hold at the fork, which nobody
in the child ever releases. Imported only once tracing is configured (it needs the SDK).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["ExporterPerProcess"]


class ExporterPerProcess(SpanExporter):
    """Exports through ``make()``'s exporter, made again on the first export in a forked child."""

    def __init__(self, make: Callable[[], SpanExporter]) -> None:
        self._make = make
        self._pid = os.getpid()
        self._exporter = make()  # in the configuring process: a bad endpoint shows at once

    def _own(self) -> SpanExporter:
        # The batch processor calls export under its own lock: one caller at a time.
        if self._pid != os.getpid():
            self._exporter = self._make()
            self._pid = os.getpid()
        return self._exporter

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Send ``spans`` with this process's own exporter."""
        return self._own().export(spans)

    def shutdown(self) -> None:
        """Shut this process's exporter down; a child leaves its parent's to its parent."""
        if self._pid == os.getpid():
            self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush this process's exporter."""
        return self._own().force_flush(timeout_millis)
