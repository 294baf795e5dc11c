"""MCP Tasks (2025-11-25) for the MCP door: a task-augmented ``tools/call`` runs in the background.

A client that sends ``tools/call`` with a ``task`` field gets a ``CreateTaskResult`` at once;
the call then runs through the door like any other (the gateway, the ledger, its deadline),
and its one result is what ``tasks/result`` returns. A call's task id is its call id
(``_meta["unstuck/call"]`` when the client names it). ``tasks/get`` and ``tasks/list`` report
``working`` until the ledger has the answer, then ``completed`` (``failed`` for an ``isError``
result, ``cancelled`` after ``tasks/cancel``, which answers the call ``cancelled`` in the ledger
the way ``notifications/cancelled`` does). Clients that do not ask keep the plain answer.

The SDK pins the 2025-11-25 surface without ``tasks/*``, so this is a middleware that answers
those methods before the SDK's method gate, and adds ``capabilities.tasks`` to the
``initialize`` result. The table of tasks lives in the door's memory (the results in the
ledger): a task outlives neither the door nor ``TASK_TTL_MS``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

import anyio
from anyio.abc import TaskGroup
from mcp.server import ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.shared.exceptions import MCPError

from workers.servers.mcp_sessions import META_CALL

__all__ = ["TASKS_PROTOCOL", "TASK_TTL_MS", "McpTasks"]

TASKS_PROTOCOL: Final = "2025-11-25"
TASK_TTL_MS: Final = 3_600_000
_POLL_MS: Final = 500
_RELATED: Final = "io.modelcontextprotocol/related-task"
_CAPABILITY: Final[dict[str, Any]] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}

Context = ServerRequestContext[Any, Any]


def _iso(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, UTC).isoformat().replace("+00:00", "Z")


@dataclass
class _Task:
    task_id: str
    ttl_ms: int
    created_s: float = field(default_factory=time.time)
    updated_s: float = field(default_factory=time.time)
    status: str = "working"
    result: dict[str, Any] | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    def wire(self) -> dict[str, Any]:
        return {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": _iso(self.created_s),
            "lastUpdatedAt": _iso(self.updated_s),
            "ttl": self.ttl_ms,
            "pollInterval": _POLL_MS,
        }

    def finish(self, status: str, result: dict[str, Any] | None) -> None:
        if self.done.is_set():
            return
        self.status, self.result, self.updated_s = status, result, time.time()
        self.done.set()


class McpTasks:
    """The tasks of one door; :meth:`serve` runs their calls, :meth:`middleware` is the protocol."""

    def __init__(self) -> None:
        self._tasks: dict[str, _Task] = {}
        self._group: TaskGroup | None = None

    async def serve(self) -> None:
        """Run task calls until cancelled (started beside the door's server)."""
        async with anyio.create_task_group() as group:
            self._group = group
            await anyio.sleep_forever()

    async def middleware(self, ctx: Context, call_next: CallNext) -> HandlerResult:
        """Answer ``tasks/*`` and task-augmented ``tools/call``; everything else passes."""
        params: Mapping[str, Any] = ctx.params if isinstance(ctx.params, Mapping) else {}
        if ctx.method == "initialize":
            return _with_capability(await call_next(ctx))
        if ctx.method == "tools/call" and isinstance(params.get("task"), Mapping) and self._group:
            return self._create(ctx, call_next, params)
        if ctx.method == "tasks/get":
            return self._task(params).wire()
        if ctx.method == "tasks/result":
            return await self._result(params)
        if ctx.method == "tasks/cancel":
            return self._cancel(params)
        if ctx.method == "tasks/list":
            self._expire()
            return {"tasks": [task.wire() for task in self._tasks.values()]}
        return await call_next(ctx)

    def _create(self, ctx: Context, call_next: CallNext, params: Mapping[str, Any]) -> dict[str, Any]:
        self._expire()
        meta = dict(params.get("_meta") or {})
        meta.pop("progressToken", None)  # the request is answered now: nobody to report progress to
        task_id = str(meta.get(META_CALL) or f"mcp-{uuid.uuid4().hex}")
        meta[META_CALL] = task_id
        ttl = params["task"].get("ttl")
        task = _Task(task_id, ttl if isinstance(ttl, int) and 0 < ttl <= TASK_TTL_MS else TASK_TTL_MS)
        self._tasks[task_id] = task
        call_params = {key: value for key, value in params.items() if key != "task"}
        call = replace(ctx, params={**call_params, "_meta": meta})
        assert self._group is not None
        self._group.start_soon(self._run, task, call, call_next)
        return {"task": task.wire()}

    async def _run(self, task: _Task, call: Context, call_next: CallNext) -> None:
        with task.scope:
            result = await call_next(call)
            answer = result if isinstance(result, dict) else {}
            task.finish("failed" if answer.get("isError") else "completed", answer)
        if task.scope.cancelled_caught:
            task.finish("cancelled", None)

    def _task(self, params: Mapping[str, Any]) -> _Task:
        task = self._tasks.get(str(params.get("taskId", "")))
        if task is None:
            raise MCPError(code=-32602, message=f"unknown task {params.get('taskId')!r}")
        return task

    async def _result(self, params: Mapping[str, Any]) -> dict[str, Any]:
        task = self._task(params)
        await task.done.wait()
        if task.result is None:
            text = f"Task {task.task_id} was cancelled; the call was answered cancelled."
            body: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": True}
        else:
            body = dict(task.result)
        meta = dict(body.get("_meta") or {})
        meta[_RELATED] = {"taskId": task.task_id}
        return {**body, "_meta": meta}

    def _cancel(self, params: Mapping[str, Any]) -> dict[str, Any]:
        task = self._task(params)
        if not task.done.is_set():
            task.scope.cancel()  # the door answers the call cancelled in the ledger, first writer wins
            task.finish("cancelled", None)
        return task.wire()

    def _expire(self) -> None:
        now = time.time()
        for task_id, task in list(self._tasks.items()):
            if task.done.is_set() and (now - task.created_s) * 1000 > task.ttl_ms:
                del self._tasks[task_id]


def _with_capability(result: HandlerResult) -> HandlerResult:
    if isinstance(result, dict) and result.get("protocolVersion") == TASKS_PROTOCOL:
        capabilities = dict(result.get("capabilities") or {})
        capabilities["tasks"] = _CAPABILITY
        return {**result, "capabilities": capabilities}
    return result
