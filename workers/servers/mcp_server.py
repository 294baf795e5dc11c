"""The MCP door: the registered tools for any MCP host, each call answered through the gateway.

Every ``tools/call`` becomes one :class:`~workers.core.models.ToolCall` run by
:class:`~workers.gateway.client.ToolGateway`, so it is answered by its deadline plus the grace
whatever the tool does. Protocol features map onto the ledger:

- every call is answered before the client gives up (``mcp.client_timeout_s``): one still
  running ``mcp.answer_margin_s`` before it is answered ``still_running``, the tool runs on
  and its late result is fetched with ``unstuck_result`` (:mod:`workers.servers.mcp_late_results`);
- the tool's heartbeats become ``notifications/progress`` when the request has a
  ``progressToken``, and a silent call reports progress every 10 s (:data:`PROGRESS_EVERY_S`)
  (``progress`` counts notifications, ``message`` is the tool's details or the time so far);
- a cancelled request (``notifications/cancelled``, a closed response stream, stdin closed,
  the door shutting down) is cancelled as ``ToolGateway.cancel`` cancels it: answered
  ``cancelled`` in the ledger, first writer wins, and its tool stopped; what the worker
  answers later is kept there as late and never sent. On Streamable HTTP the SDK
  keeps serving a request whose client hung up (for resumption, which this door does not
  offer), so :meth:`McpDoor.client_left` cancels it when the transport sees the hang-up;
- arguments that fail the tool's schema, or are not even a JSON object, get an ``isError``
  result (``invalid_arguments``), never a protocol error.

Sessions and runs: see :mod:`workers.servers.mcp_sessions`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from importlib.metadata import version
from typing import Any, Final, TypeVar, TypeVarTuple, Unpack

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult

from workers import tracing
from workers.answering.service import Answers
from workers.core.models import SyntheticReason, ToolCall, ToolResult
from workers.core.results import answer_by_deadline, rejected_result, synthetic_result
from workers.core.run_health import RunStatus
from workers.errors import InvalidArguments, LoopDetected, StoreError
from workers.gateway.client import ToolGateway
from workers.runtime import open_ledger, worker_id
from workers.servers.mcp_late_results import (
    RESULT_TOOL,
    StillRunningCall,
    StillRunningCalls,
    answer_within_s,
    fetched_result,
    not_ready_result,
    result_tool_entry,
    still_running_result,
    unknown_call_result,
    wanted_call_id,
)
from workers.servers.mcp_sessions import CallTarget, RunTracker, agent_of, resolve_target
from workers.servers.mcp_tasks import McpTasks
from workers.settings import Settings
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger
from workers.store.records import CALL, CallField, Row
from workers.tools.definitions import parameters_schema
from workers.tools.registry import ToolSpec, registered_tools
from workers.tools.upstreams import on_tools_changed, start_sessions

__all__ = [
    "MALFORMED_ARGUMENTS",
    "PROGRESS_EVERY_S",
    "McpDoor",
    "accept_any_arguments",
    "to_mcp_result",
    "tool_entries",
]

log = logging.getLogger(__name__)

MALFORMED_ARGUMENTS: Final = "unstuck/malformed_arguments"
_MAX_LISTERS: Final = 1024  # client sessions told of an upstream's tool changes
_MAX_WAITING: Final = 512  # calls waited on at once; more queue for a thread
_PROGRESS_POLL_S: Final = 0.5
PROGRESS_EVERY_S: Final = 10.0  # a silent call still reports progress this often
_MAX_BEAT_INTERVAL_S: Final = 10.0
_BETWEEN_CALLS: Final = "mcp client between calls"
_INSTRUCTIONS: Final = (
    "Tools run by unstuck: every call is answered by its deadline, also when the tool hangs or "
    "crashes. An isError result with details.synthetic says what happened and what to do next."
)

Context = ServerRequestContext[Any, Any]
T = TypeVar("T")
Args = TypeVarTuple("Args")


def _spec_entry(spec: ToolSpec, settings: Settings, agent_id: str) -> types.Tool:
    timeout_s = settings.tool_timeout_s(agent_id, spec.name, spec.soft_timeout_s)
    annotations = (
        types.ToolAnnotations.model_validate(spec.annotations)
        if spec.annotations is not None
        else types.ToolAnnotations(idempotent_hint=spec.idempotent)
    )
    return types.Tool(
        name=spec.name,
        description=spec.description or None,
        input_schema=parameters_schema(spec),
        annotations=annotations,
        # Never "required": OpenClaw drops tools that require tasks; a plain call still works.
        execution=types.ToolExecution(task_support="optional"),
        meta={"unstuck/timeout_s": timeout_s},
    )


def tool_entries(settings: Settings, agent_id: str = "main") -> list[types.Tool]:
    """The tools ``agent_id`` may call as MCP ``Tool`` entries, by name (``_meta`` has the soft limit)."""
    specs = registered_tools()
    allowed = settings.tool_policy(agent_id).filter(sorted(specs))
    return [_spec_entry(specs[name], settings, agent_id) for name in allowed]


def to_mcp_result(result: ToolResult, target: CallTarget) -> types.CallToolResult:
    """The MCP form of a result: its text, ``isError``, and where it lives in ``_meta``."""
    meta = {
        "unstuck/session": target.session_key,
        "unstuck/run": target.run_id,
        "unstuck/call": target.call_id,
        "unstuck/details": result.details,
    }
    content: list[types.ContentBlock] = [types.TextContent(text=block.text) for block in result.content]
    return types.CallToolResult(content=content, is_error=result.is_error, meta=meta)


async def accept_any_arguments(ctx: Context, call_next: CallNext) -> HandlerResult:
    """Middleware: let ``tools/call`` through when its arguments are not a JSON object.

    The SDK would refuse such a request with a protocol error before any handler runs; the
    arguments are replaced by ``{}`` and their JSON type is noted in ``_meta`` instead, so the
    door answers the call ``invalid_arguments`` like any other schema failure.
    """
    params = ctx.params
    if ctx.method != "tools/call" or not isinstance(params, Mapping):
        return await call_next(ctx)
    arguments = params.get("arguments")
    if arguments is None or isinstance(arguments, Mapping):
        return await call_next(ctx)
    meta = params.get("_meta")
    marked = {**(meta if isinstance(meta, Mapping) else {}), MALFORMED_ARGUMENTS: _json_type(arguments)}
    return await call_next(replace(ctx, params={**params, "arguments": {}, "_meta": marked}))


def _json_type(value: object) -> str:
    names = {str: "a string", bool: "a boolean", int: "a number", float: "a number", list: "an array"}
    return names.get(type(value), "not an object")


class McpDoor:
    """The MCP server's handlers over one shared gateway; async, waiting in worker threads."""

    def __init__(
        self,
        settings: Settings,
        gateway: ToolGateway,
        ledger: Ledger,
        *,
        stdio_session: str | None = None,
        clock: Callable[[], float] = time.time,
        progress_every_s: float = PROGRESS_EVERY_S,
    ) -> None:
        self.settings = settings
        self.gateway = gateway
        self.ledger = ledger
        self.runs = RunTracker(int(settings.api.mcp_run_idle_s * 1000))
        self._stdio_session = stdio_session
        self._clock = clock
        self._progress_every_ms = int(progress_every_s * 1000)
        self._writer = f"{worker_id()}/mcp"
        self._limiter = anyio.CapacityLimiter(_MAX_WAITING)
        self.still_running = StillRunningCalls()
        self._answer_within_s = answer_within_s(settings.mcp)
        # What the door answers itself goes through the answering service (tools.fallbacks).
        self._answers = Answers(writer=self._writer, fallbacks=settings.tools.failure_rules().fallbacks)
        self._in_flight: dict[tuple[str, str], anyio.CancelScope] = {}
        self.open_calls = 0  # tools/call requests not yet answered
        self.tasks = McpTasks()  # task-augmented calls; the transport runs tasks.serve()
        self._listers: dict[int, Any] = {}  # the sessions that listed the tools, by id
        self._follows_upstreams = bool(settings.mcp.upstreams())
        self.tools_changed = threading.Event()  # set from an upstream session's thread

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        stdio_session: str | None = None,
        progress_every_s: float = PROGRESS_EVERY_S,
    ) -> McpDoor:
        """A door with its own gateway and ledger connection (tools load here)."""
        gateway, ledger = ToolGateway(settings), open_ledger(settings)
        gateway.watch_answers(ledger)  # a cancelled call's task is closed in Flower too
        door = cls(settings, gateway, ledger, stdio_session=stdio_session, progress_every_s=progress_every_s)
        # Live sessions to the upstreams, so the door follows their tools/list_changed.
        on_tools_changed(door.tools_changed.set)
        start_sessions(settings.mcp.upstreams())
        return door

    def server(self) -> Server[Any]:
        """The MCP server: ``tools/list`` and ``tools/call``, nothing else."""
        server: Server[Any] = Server(
            "unstuck",
            version=version("unstuck"),
            instructions=_INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            get_tool_input_schema=self._input_schema,
        )
        server.middleware.append(self.tasks.middleware)  # outermost: a task's call passes the rest
        server.middleware.append(accept_any_arguments)
        return server

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        if name == RESULT_TOOL:
            return dict(result_tool_entry().input_schema)
        spec = registered_tools().get(name)
        return parameters_schema(spec) if spec is not None else None

    async def _list_tools(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if self._follows_upstreams:  # told when an upstream's tools change; the newest kept
            self._listers[id(ctx.session)] = ctx.session
            while len(self._listers) > _MAX_LISTERS:
                del self._listers[next(iter(self._listers))]
        meta = params.meta if params is not None else None
        return types.ListToolsResult(
            tools=[*tool_entries(self.settings, agent_of(meta)), result_tool_entry()]
        )

    async def _call_tool(self, ctx: Context, params: types.CallToolRequestParams) -> types.CallToolResult:
        meta: Mapping[str, Any] = params.meta or {}
        with tracing.joined(meta):  # params._meta.traceparent: the caller's trace
            return await self._call_tool_in(ctx, params, meta)

    async def _call_tool_in(
        self, ctx: Context, params: types.CallToolRequestParams, meta: Mapping[str, Any]
    ) -> types.CallToolResult:
        target = await self._open(meta, ctx)
        call = ToolCall(id=target.call_id, name=params.name[:256] or "?", arguments=params.arguments or {})
        started_ms = self._now_ms()
        result: ToolResult | None = None
        self.open_calls += 1
        try:
            with self._cancellable(ctx):
                result = await self._answer(ctx, target, call, meta)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._thread(self._answer_cancelled, target, call, started_ms)
                await self._close(target)
            raise
        finally:
            self.open_calls -= 1
        if result is None:  # the client hung up: nobody to deliver to, answered cancelled
            result = await self._thread(self._cancelled_answer, target, call, started_ms)
        await self._close(target, result)
        return to_mcp_result(result, target)

    @contextlib.contextmanager
    def _cancellable(self, ctx: Context) -> Iterator[anyio.CancelScope]:
        """A scope :meth:`client_left` cancels when the request's HTTP client hangs up."""
        session_id = _http_session_id(ctx)
        key = (session_id, str(ctx.request_id)) if session_id and ctx.request_id is not None else None
        with anyio.CancelScope() as scope:
            if key is not None:
                self._in_flight[key] = scope
            try:
                yield scope
            finally:
                if key is not None and self._in_flight.get(key) is scope:
                    del self._in_flight[key]

    def client_left(self, session_id: str, request_ids: Iterable[str]) -> None:
        """The HTTP client of these requests hung up before their answers: cancel them."""
        for request_id in request_ids:
            scope = self._in_flight.pop((session_id, request_id), None)
            if scope is not None:
                scope.cancel()

    async def _answer(
        self, ctx: Context, target: CallTarget, call: ToolCall, meta: Mapping[str, Any]
    ) -> ToolResult:
        malformed = meta.get(MALFORMED_ARGUMENTS)
        if malformed is not None:
            return await self._thread(self._refuse_arguments, target, call, str(malformed))
        if call.name == RESULT_TOOL:
            return await self._fetch_late(target, call)
        started_ms = self._now_ms()
        async with anyio.create_task_group() as relays:
            if meta.get("progress_token") is not None:
                relays.start_soon(self._relay_progress, ctx, target, started_ms)
            with anyio.move_on_after(self._answer_within_s) as before_the_client:
                result = await self._thread(self._call_blocking, target, call)
            if before_the_client.cancelled_caught:
                result = await self._thread(self._answer_still_running, target, call, started_ms)
            relays.cancel_scope.cancel()
        return result

    def _answer_still_running(self, target: CallTarget, call: ToolCall, started_ms: int) -> ToolResult:
        """Answer ``still_running`` unless the call was answered first; the call's one result."""
        keys, now = self._keys(target), self._now_ms()
        try:
            record = self.ledger.record(keys, call.id)
            attempt = record.row.integer(CallField.ATTEMPT) if record is not None else 0
            result = still_running_result(call, elapsed_ms=now - started_ms, attempt=attempt)
            answered = self._answers.answer(keys, result, now_ms=now).on(self.ledger)
            if answered.won:
                self.still_running.add(StillRunningCall(target, call.name, started_ms))
            return answered.result
        except StoreError as exc:
            # The ledger cannot be read or written: the gateway's own wait answers by the deadline.
            log.warning("still_running answer of %s not recorded: %s", call.id, exc)
            return self._call_blocking(target, call)

    async def _fetch_late(self, target: CallTarget, call: ToolCall) -> ToolResult:
        """Answer an ``unstuck_result`` call: the late result, waited for up to the client's patience."""
        call_id = wanted_call_id(call.arguments)
        waited = self.still_running.get(call_id) if call_id is not None else None
        if waited is None:
            result = unknown_call_result(call, call_id)
        else:
            late = None
            with anyio.move_on_after(self._answer_within_s):
                late = await self._wait_late(waited)
            result = (
                fetched_result(call, waited, late)
                if late is not None
                else not_ready_result(call, waited, now_ms=self._now_ms())
            )
        result = self._answers.given(result)
        await self._thread(self._record, target, result)
        return result

    async def _wait_late(self, waited: StillRunningCall) -> ToolResult:
        while True:
            late = await self._thread(self._late_result, waited)
            if late is not None:
                return late
            await anyio.sleep(_PROGRESS_POLL_S)

    def _late_result(self, waited: StillRunningCall) -> ToolResult | None:
        try:
            late = self.ledger.late_results(self._keys(waited.target), waited.target.call_id)
        except StoreError:
            return None
        return late[0] if late else None

    def _record(self, target: CallTarget, result: ToolResult) -> None:
        try:
            self._answers.offer(self._keys(target), result, now_ms=self._now_ms()).on(self.ledger)
        except StoreError as exc:
            log.warning("answer of %s not recorded: %s", result.tool_call_id, exc)

    async def _thread(self, func: Callable[[Unpack[Args]], T], *args: *Args) -> T:
        # Abandoned on cancel: the thread finishes on its own once the ledger has the answer.
        return await anyio.to_thread.run_sync(func, *args, abandon_on_cancel=True, limiter=self._limiter)

    async def _open(self, meta: Mapping[str, Any], ctx: Context) -> CallTarget:
        target = resolve_target(meta, mcp_session_id=self._stdio_session or _http_session_id(ctx))
        if target.run_id:
            if target.named_run and not target.ephemeral:
                self.runs.forget(target.session_key)
            return target
        profile = self.settings.agents.for_agent(target.agent_id)
        run_id, replaced = self.runs.begin(
            target.session_key,
            agent_id=target.agent_id,
            now_ms=self._now_ms(),
            max_age_ms=int(profile.run_timeout_s * 500),
        )
        if replaced is not None:
            # Shielded: the call now counts as open, and only _call_tool's try may close it.
            with anyio.CancelScope(shield=True):
                await self._thread(self._end_run, target.session_key, replaced)
        return replace(target, run_id=run_id)

    async def _close(self, target: CallTarget, result: ToolResult | None = None) -> None:
        if target.ephemeral:
            await self._thread(self._end_run, target.session_key, target.run_id)
        elif not target.named_run:
            self.runs.finish(target.session_key, target.run_id, now_ms=self._now_ms())
            if result is not None and result.reason == SyntheticReason.RUN_ABORTED.value:
                self.runs.forget(target.session_key, target.run_id)  # ended under us: start anew

    def _keys(self, target: CallTarget) -> RunKeys:
        return self.ledger.keys(target.session_key, target.run_id)

    def _call_blocking(self, target: CallTarget, call: ToolCall) -> ToolResult:
        try:
            results = self.gateway.call_tools(
                session_key=target.session_key, run_id=target.run_id, agent_id=target.agent_id, calls=[call]
            )
        except LoopDetected as exc:  # the run was aborted; the call still has its one result
            results = exc.results
        result: ToolResult = results[0]
        return result

    def _refuse_arguments(self, target: CallTarget, call: ToolCall, json_type: str) -> ToolResult:
        error = InvalidArguments(call.name, [f"<arguments>: must be a JSON object, got {json_type}"])
        result = rejected_result(call, error, 0)  # a refusal: no fallback covers it
        try:
            self._answers.offer(self._keys(target), result, now_ms=self._now_ms()).on(self.ledger)
        except StoreError as exc:
            log.warning("refusal of %s not recorded: %s", call.id, exc)
        return result

    def _cancelled_answer(self, target: CallTarget, call: ToolCall, started_ms: int) -> ToolResult:
        """Answer the call ``cancelled`` (first writer wins) and return its one result."""
        answered = self._answer_cancelled(target, call, started_ms)
        if answered is not None:
            return answered
        elapsed_ms = self._now_ms() - started_ms
        return self._answers.given(
            synthetic_result(call, SyntheticReason.CANCELLED, elapsed_ms=elapsed_ms, attempt=0)
        )

    def _answer_cancelled(self, target: CallTarget, call: ToolCall, started_ms: int) -> ToolResult | None:
        """Cancel the call as ``ToolGateway.cancel`` does, and answer it ``cancelled`` now.

        The gateway's cancel marks it, so its worker stops the tool (a cancel means the same
        from every door); the door's own answer, unless something answered first, is written
        at once because its client is gone or has moved on. The call's one answer (the kept
        one), None when the store is unreachable.
        """
        keys = self._keys(target)
        try:
            self.gateway.cancel(target.session_key, target.run_id, call.id)
            now = self._now_ms()
            record = self.ledger.record(keys, call.id)
            row = record.row if record is not None else Row(CALL, {})
            result = synthetic_result(
                call,
                SyntheticReason.CANCELLED,
                elapsed_ms=now - started_ms,
                attempt=row.integer(CallField.ATTEMPT),
                detail=" by the MCP client",
            )
            if CallField.DEADLINE_MS in row:
                deadline_ms = row.integer(CallField.DEADLINE_MS)
                submitted_ms = row.maybe_integer(CallField.SUBMITTED_MS)
                submitted_ms = deadline_ms if submitted_ms is None else submitted_ms
                result = answer_by_deadline(
                    result, call, submitted_ms=submitted_ms, deadline_ms=deadline_ms, now_ms=now
                )
            return self._answers.answer(keys, result, now_ms=now).on(self.ledger).result
        except StoreError as exc:
            log.warning("cancel of %s not recorded (answered at its deadline instead): %s", call.id, exc)
            return None

    async def _relay_progress(self, ctx: Context, target: CallTarget, started_ms: int) -> None:
        keys, seen_ms, count = self._keys(target), 0, 0
        reported_ms, every_ms = started_ms, self._progress_every_ms
        while True:
            await anyio.sleep(_PROGRESS_POLL_S)
            beat = await self._thread(self._last_heartbeat, keys, target.call_id)
            now = self._now_ms()
            running_for = f"running for {(now - started_ms) / 1000:.0f}s"
            if beat is not None and beat[0] > seen_ms:
                seen_ms, message = beat[0], beat[1] or running_for
            elif now - reported_ms >= every_ms:
                message = running_for
            else:
                continue
            count, reported_ms = count + 1, now
            await ctx.session.report_progress(count, None, message)

    def _last_heartbeat(self, keys: RunKeys, call_id: str) -> tuple[int, str] | None:
        try:
            record = self.ledger.record(keys, call_id)
        except StoreError:
            return None
        if record is None or CallField.HB_MS not in record.row:
            return None
        return record.row.integer(CallField.HB_MS), record.row.text(CallField.PROGRESS)

    def _end_run(self, session_key: str, run_id: str) -> None:
        try:
            self.gateway.end_run(session_key, run_id, RunStatus.COMPLETED)
        except StoreError as exc:
            log.warning("run %s/%s not ended (its deadline ends it): %s", session_key, run_id, exc)

    async def sweep_idle_runs(self, interval_s: float = 1.0) -> None:
        """End runs idle for ``api.mcp_run_idle_s``, heartbeat the others; runs until cancelled."""
        every_ms = int(min(_MAX_BEAT_INTERVAL_S, self.settings.watchdog.stalled_after_s / 3) * 1000)
        while True:
            await anyio.sleep(min(interval_s, self.settings.api.mcp_run_idle_s / 4))
            if self.tools_changed.is_set():
                self.tools_changed.clear()
                await self._tell_tools_changed()
            for session_key, run_id in self.runs.idle(self._now_ms()):
                await self._thread(self._end_run, session_key, run_id)
            for session_key, run_id, agent_id in self.runs.due_beats(self._now_ms(), every_ms):
                beat = functools.partial(self.gateway.heartbeat, agent_id=agent_id, what=_BETWEEN_CALLS)
                if not await self._thread(beat, session_key, run_id):
                    self.runs.forget(session_key, run_id)  # ended under us: the next call starts anew

    async def _tell_tools_changed(self) -> None:
        """``notifications/tools/list_changed`` to every client that listed the tools."""
        for key, session in list(self._listers.items()):
            try:
                await session.send_tool_list_changed()
            except Exception:  # noqa: BLE001 - a client gone away is simply not told
                del self._listers[key]

    async def aclose(self) -> None:
        """End every run the door started and release connections."""
        with anyio.CancelScope(shield=True):
            for session_key, run_id in self.runs.drain():
                await self._thread(self._end_run, session_key, run_id)
        self.gateway.close()
        self.ledger.close()


def _http_session_id(ctx: Context) -> str | None:
    """The ``Mcp-Session-Id`` of a Streamable HTTP request (None on stdio or sessionless)."""
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return None
    value = headers.get("mcp-session-id")
    return str(value) if value else None
