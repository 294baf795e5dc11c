"""MCP upstreams as ordinary tools: each upstream tool registered as ``<name>__<tool>``.

Every process that loads tools (workers, the doors, ``unstuck config check``) starts each
upstream once, lists its tools and registers them with the upstream's description, input
schema and annotations, and the limits of the entry's ``"unstuck"`` object. A call then runs
like any ``@tool``: a Celery task on a tool worker, in the ledger, under its deadline.

Sessions: each process that runs calls (a worker's pool child) keeps one session per
upstream, started with the child and kept between calls. So a stdio upstream runs once per
pool child, each with its own state. An upstream marked ``"stateful": true`` keeps state in
memory and must look like one server: its tools carry ``stateful_upstream``, so the gateway
sends their calls to the upstream's own queue, which only ``unstuck worker --upstream NAME``
serves, with one pool child; the other workers never start it. The lister's session is closed
before a worker forks.

An upstream that cannot start is left out: its tools are not registered, the log and
``unstuck config check`` name it with its command and the end of its stderr
(:func:`upstream_failures`), and the other upstreams are served.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from pydantic import ConfigDict, create_model

from workers.core.mcp_upstreams import TOOL_SEPARATOR, Upstream, served_name
from workers.core.models import RetryPolicy
from workers.errors import ConfigError
from workers.tools import upstream_reaper
from workers.tools.context import ToolContext
from workers.tools.registry import ToolSpec, register_spec, unregister_where
from workers.tools.upstream_session import UpstreamSession, UpstreamUnavailable

__all__ = [
    "UpstreamFailure",
    "is_upstream_tool",
    "on_tools_changed",
    "register_upstreams",
    "session_for",
    "start_sessions",
    "stop_sessions",
    "upstream_failures",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpstreamFailure:
    """An upstream whose tools are left out, and why."""

    name: str
    command: str
    error: str


_lock = threading.Lock()
_sessions: dict[str, UpstreamSession] = {}
_sessions_pid = 0
_listed: dict[str, Upstream] = {}
_failures: dict[str, UpstreamFailure] = {}
_on_change: list[Callable[[], None]] = []


# Never used to validate: an upstream's tool is checked against its own input schema.
_ANY_ARGUMENTS = create_model("upstream_arguments", __config__=ConfigDict(extra="allow"))


def is_upstream_tool(spec: ToolSpec) -> bool:
    """Whether ``spec`` was registered from an MCP upstream."""
    return getattr(spec.func, "upstream", None) is not None


def upstream_failures() -> list[UpstreamFailure]:
    """The upstreams of this process that could not start (their tools are left out)."""
    return list(_failures.values())


def on_tools_changed(callback: Callable[[], None]) -> None:
    """Call ``callback`` after an upstream's tools were listed again (``tools/list_changed``)."""
    _on_change.append(callback)


def session_for(upstream: Upstream) -> UpstreamSession:
    """This process's session to ``upstream`` (a forked child never uses its parent's)."""
    global _sessions_pid
    with _lock:
        if _sessions_pid != os.getpid():
            _sessions.clear()  # the parent's threads and pipes did not come along
            _sessions_pid = os.getpid()
        session = _sessions.get(upstream.name)
        if session is None or session.upstream != upstream:
            session = UpstreamSession(upstream, on_tools_changed=lambda: _relist(upstream))
            _sessions[upstream.name] = session
        return session


def start_sessions(upstreams: Mapping[str, Upstream], *, serving: str = "") -> None:
    """Start this process's session to each listed upstream, in the background (a pool child's start).

    ``serving``: the stateful upstream this worker serves (``unstuck worker --upstream``); a
    stateful upstream is started only by its own worker, a stateless one only by the others.
    """

    def start(session: UpstreamSession) -> None:
        try:
            session.ensure_started()
        except UpstreamUnavailable as exc:
            log.warning("%s (its calls start it again)", exc)

    for pgid in upstream_reaper.reap_orphans():
        log.warning("killed MCP upstream process group %d: the pool child that ran it died", pgid)
    for upstream in upstreams.values():
        ours = upstream.name == serving if upstream.unstuck.stateful else not serving
        if ours and _listed.get(upstream.name) == upstream:
            threading.Thread(target=start, args=(session_for(upstream),), daemon=True).start()


def stop_sessions() -> None:
    """Close this process's upstream sessions and kill their process groups (a pool child's exit).

    A stdio upstream is meant to exit when its stdin closes, but some never do (server-everything
    keeps its timers running): without this, each pool child that leaves leaves its upstreams behind.
    """
    with _lock:
        sessions = list(_sessions.values()) if _sessions_pid == os.getpid() else []
        _sessions.clear()
    for session in sessions:
        session.close()


def register_upstreams(upstreams: Mapping[str, Upstream]) -> list[UpstreamFailure]:
    """List every upstream not listed yet in this process and register its tools.

    Returns the upstreams that could not start (logged; their tools are left out).

    Raises:
        ConfigError: an upstream's tool limits do not fit (hard limit not above the soft one).
    """
    for upstream in upstreams.values():
        if _listed.get(upstream.name) == upstream:
            continue
        session = UpstreamSession(upstream)
        try:
            session.ensure_started()
            tools = session.list_tools()
        except UpstreamUnavailable as exc:
            _failures[upstream.name] = UpstreamFailure(upstream.name, upstream.describe(), str(exc))
            log.error("%s; its tools are left out", exc)
            continue
        finally:
            session.close()  # a worker forks after this: its children start their own
        _failures.pop(upstream.name, None)
        _register(upstream, tools)
        _listed[upstream.name] = upstream
    return upstream_failures()


def _relist(upstream: Upstream) -> None:
    """Follow ``tools/list_changed``: list through the live session and register anew."""
    try:
        tools = session_for(upstream).list_tools()
    except Exception as exc:  # noqa: BLE001 - the old list stays; the next change tries again
        log.warning("MCP upstream %s: listing its changed tools failed: %s", upstream.name, exc)
        return
    _register(upstream, tools)
    for callback in list(_on_change):
        callback()


def _register(upstream: Upstream, tools: list[types.Tool]) -> None:
    prefix = upstream.name + TOOL_SEPARATOR
    unregister_where(lambda spec: not (is_upstream_tool(spec) and spec.name.startswith(prefix)))
    for tool in tools:
        try:
            register_spec(_spec(upstream, tool))
        except ConfigError as exc:
            raise ConfigError([(f"mcp.upstreams_file: mcpServers.{upstream.name}", str(exc))]) from None


def _spec(upstream: Upstream, tool: types.Tool) -> ToolSpec:
    limits = upstream.unstuck.for_tool(tool.name)
    annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else None
    return ToolSpec(
        name=served_name(upstream.name, tool.name),
        func=_caller(
            upstream, tool.name, as_task=bool(tool.execution and tool.execution.task_support == "required")
        ),
        arguments_model=_ANY_ARGUMENTS,
        wants_context=True,
        soft_timeout_s=limits.soft_timeout_s,
        hard_timeout_s=limits.hard_timeout_s,
        idempotent=bool(annotations and annotations.get("idempotentHint")),
        retry=limits.retry_policy() or RetryPolicy(),
        description=tool.description or "",
        memory_limit_mb=limits.memory_limit_mb,
        input_schema=dict(tool.input_schema),
        annotations=annotations,
        stateful_upstream=upstream.name if upstream.unstuck.stateful else None,
    )


def _caller(upstream: Upstream, tool: str, *, as_task: bool) -> Callable[[dict[str, Any], ToolContext], str]:
    def call(arguments: dict[str, Any], ctx: ToolContext) -> str:
        session = session_for(upstream)
        session.ensure_started()
        # Not registered with the call: a cancel must reach the upstream as notifications/cancelled,
        # not as a signal to its process group (which would lose its state). A pool child killed
        # at a hard limit leaves its upstream to the next child (upstream_reaper).
        result = session.call(
            tool, arguments, on_progress=_heartbeat(ctx), as_task=as_task, cancelled=lambda: ctx.cancelled
        )
        return _text(result)

    call.upstream = upstream.name  # type: ignore[attr-defined]
    call.__qualname__ = f"upstream.{served_name(upstream.name, tool)}"
    return call


def _heartbeat(ctx: ToolContext) -> Callable[[float, float | None, str | None], None]:
    def beat(done: float, total: float | None, message: str | None) -> None:
        ctx.heartbeat(message or ({"progress": done, "total": total} if total else {"progress": done}))

    return beat


def _text(result: types.CallToolResult) -> str:
    parts = [
        block.text
        if isinstance(block, types.TextContent)
        else block.model_dump_json(by_alias=True, exclude_none=True)
        for block in result.content
    ]
    if not parts and result.structured_content is not None:
        return types.CallToolResult.model_validate(result).model_dump_json(by_alias=True, exclude_none=True)
    return "\n".join(parts)
