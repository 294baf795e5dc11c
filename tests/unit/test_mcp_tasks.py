"""MCP Tasks in the door: a task-augmented call answered at once, its result through tasks/result."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import anyio
import anyio.lowlevel
import pytest
from mcp.shared.exceptions import MCPError

from workers.servers.mcp_tasks import McpTasks


@dataclass
class _Ctx:
    method: str
    params: dict[str, Any] | None = None


Next = Callable[[Any], Awaitable[Any]]


async def _ask(tasks: McpTasks, method: str, params: dict[str, Any], call_next: Next) -> Any:
    return await tasks.middleware(cast(Any, _Ctx(method, params)), call_next)


def _call_next(release: anyio.Event, seen: list[dict[str, Any]], *, is_error: bool = False) -> Next:
    async def call_next(ctx: Any) -> dict[str, Any]:
        seen.append(ctx.params)
        await release.wait()
        return {"content": [{"type": "text", "text": "done"}], "isError": is_error, "_meta": {"x": 1}}

    return call_next


async def test_a_task_runs_in_the_background_and_its_result_comes_through_tasks_result() -> None:
    tasks, release = McpTasks(), anyio.Event()
    seen: list[dict[str, Any]] = []
    call_next = _call_next(release, seen)
    async with anyio.create_task_group() as group:
        group.start_soon(tasks.serve)
        await anyio.lowlevel.checkpoint()
        params = {"name": "t", "arguments": {}, "task": {"ttl": 5000}, "_meta": {"progressToken": 1}}
        created = await _ask(tasks, "tools/call", params, call_next)
        task_id = created["task"]["taskId"]
        working = await _ask(tasks, "tasks/get", {"taskId": task_id}, call_next)
        release.set()
        result = await _ask(tasks, "tasks/result", {"taskId": task_id}, call_next)
        done = await _ask(tasks, "tasks/get", {"taskId": task_id}, call_next)
        listed = await _ask(tasks, "tasks/list", {}, call_next)
        group.cancel_scope.cancel()
    assert (created["task"]["status"], created["task"]["ttl"], working["status"]) == (
        "working",
        5000,
        "working",
    )
    # The call ran with its id = the task id, without the task field and the progress token
    assert seen == [{"name": "t", "arguments": {}, "_meta": {"unstuck/call": task_id}}]
    assert result["content"][0]["text"] == "done"
    assert result["_meta"] == {"x": 1, "io.modelcontextprotocol/related-task": {"taskId": task_id}}
    assert done["status"] == "completed"
    assert [task["taskId"] for task in listed["tasks"]] == [task_id]


async def test_an_error_result_fails_the_task_and_a_cancel_cancels_the_call() -> None:
    tasks, release = McpTasks(), anyio.Event()
    seen: list[dict[str, Any]] = []
    async with anyio.create_task_group() as group:
        group.start_soon(tasks.serve)
        await anyio.lowlevel.checkpoint()
        failing = await _ask(
            tasks,
            "tools/call",
            {"name": "f", "task": {}, "_meta": {"unstuck/call": "c1"}},
            _call_next(release, seen, is_error=True),
        )
        hanging = await _ask(tasks, "tools/call", {"name": "h", "task": {}}, _call_next(anyio.Event(), seen))
        release.set()
        await _ask(tasks, "tasks/result", {"taskId": "c1"}, _call_next(release, seen))
        failed = await _ask(tasks, "tasks/get", {"taskId": "c1"}, _call_next(release, seen))
        hanging_id = hanging["task"]["taskId"]
        cancelled = await _ask(tasks, "tasks/cancel", {"taskId": hanging_id}, _call_next(release, seen))
        answer = await _ask(tasks, "tasks/result", {"taskId": hanging_id}, _call_next(release, seen))
        with pytest.raises(MCPError, match="unknown task"):
            await _ask(tasks, "tasks/get", {"taskId": "nope"}, _call_next(release, seen))
        group.cancel_scope.cancel()
    assert failing["task"]["taskId"] == "c1"
    assert failed["status"] == "failed"
    assert cancelled["status"] == "cancelled"
    assert answer["isError"] is True


async def test_the_initialize_result_offers_tasks_on_2025_11_25_only() -> None:
    tasks = McpTasks()

    def initialized(version: str) -> Next:
        async def call_next(ctx: Any) -> dict[str, Any]:
            return {"protocolVersion": version, "capabilities": {"tools": {}}}

        return call_next

    new = await _ask(tasks, "initialize", {}, initialized("2025-11-25"))
    old = await _ask(tasks, "initialize", {}, initialized("2025-06-18"))
    assert new["capabilities"]["tasks"]["requests"] == {"tools": {"call": {}}}
    assert "tasks" not in old["capabilities"]


async def test_without_serve_a_task_augmented_call_is_a_plain_call() -> None:
    release = anyio.Event()
    seen: list[dict[str, Any]] = []
    release.set()
    plain = await _ask(McpTasks(), "tools/call", {"name": "t", "task": {}}, _call_next(release, seen))
    assert plain["content"][0]["text"] == "done"
