"""Per-call memory limits: which limit a call runs under, its rlimit, and what a call past it is told.

A call's limit bounds the memory the call *adds*: what its pool child allocates while the
tool runs, plus everything the processes it starts use. Where the worker may create a
cgroup per call, the kernel counts exactly that (the child's memory from before the call
stays charged where it was) and kills a process of the call when the cgroup is full; the
rlimit (``RLIMIT_DATA``: private writable memory) is set on top, so an allocation in the
child itself fails with ``MemoryError`` before the kernel has to kill anything.
``RLIMIT_AS`` is not used: it counts address space that is reserved but never touched,
which V8, the JVM and Go reserve by the gigabyte, so it would break the programs a tool runs.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from workers.core.models import SyntheticReason, ToolCall, ToolResult
from workers.core.results import render_value, synthetic_result

__all__ = [
    "MIB",
    "OomCause",
    "data_rlimit_bytes",
    "lost_child_reason",
    "out_of_memory_result",
    "resolve_memory_limit_mb",
]

MIB = 1024 * 1024
PARTIAL_TEXT_LIMIT = 2000


class OomCause(enum.StrEnum):
    """How a call was found past its memory limit."""

    ALLOCATION_REFUSED = "allocation_refused"  # MemoryError in the pool child (the rlimit)
    PROCESS_KILLED = "process_killed"  # the kernel killed a process the tool started
    CHILD_KILLED = "child_killed"  # the kernel killed the pool child running the tool


_CAUSE_CLAUSES = {
    OomCause.ALLOCATION_REFUSED: "",
    OomCause.PROCESS_KILLED: " (the kernel killed a process it started)",
    OomCause.CHILD_KILLED: " (the kernel killed its process)",
}


def resolve_memory_limit_mb(
    tool: str, *, configured: Mapping[str, int], declared: int | None, default: int
) -> int | None:
    """The limit ``tool``'s calls run under: config per tool, else the decorator's, else the default.

    0 at the level that decides means no limit (None).
    """
    if tool in configured:
        value = configured[tool]
    elif declared is not None:
        value = declared
    else:
        value = default
    return value or None


def data_rlimit_bytes(current_data_bytes: int, limit_mb: int, hard_limit: int) -> int:
    """The soft ``RLIMIT_DATA`` for a call: what the process maps now plus the call's allowance.

    ``hard_limit`` is the process's hard limit (-1 for unlimited, as ``resource`` reports
    ``RLIM_INFINITY``); an unprivileged process cannot go above it.
    """
    wanted = current_data_bytes + limit_mb * MIB
    return wanted if hard_limit < 0 else min(wanted, hard_limit)


def lost_child_reason(oom_kills: int) -> SyntheticReason:
    """Why a pool child died: the kernel's OOM killer in its call's cgroup, or anything else."""
    return SyntheticReason.OUT_OF_MEMORY if oom_kills > 0 else SyntheticReason.CRASHED


def out_of_memory_result(
    call: ToolCall,
    *,
    limit_mb: int | None,
    cause: OomCause,
    elapsed_ms: int,
    attempt: int,
    partial: Any = None,
) -> ToolResult:
    """The ``out_of_memory`` answer: names the limit and tells the model to ask for less.

    ``partial`` is what the tool returned after a process it started was killed, if it did.
    """
    detail = _CAUSE_CLAUSES[cause]
    extra: dict[str, Any] = {"memory_limit_mb": limit_mb, "oom": cause.value}
    if partial is not None:
        extra["partial"] = partial
        detail += "; what it returned: " + render_value(partial)[:PARTIAL_TEXT_LIMIT]
    return synthetic_result(
        call,
        SyntheticReason.OUT_OF_MEMORY,
        elapsed_ms=elapsed_ms,
        attempt=attempt,
        detail=detail,
        extra=extra,
        limit_mb=limit_mb,
    )
