"""Calls the MCP door answered ``still_running``, and the ``unstuck_result`` tool that fetches them.

An MCP client gives up on a request after its own timeout (60 s in the SDKs and OpenClaw) and
then shows the model a protocol error, never the tool's result. So the door answers a call
still running ``mcp.answer_margin_s`` before ``mcp.client_timeout_s`` itself: ``still_running``,
naming the call id. That answer is the call's one result in the ledger (first result wins);
the tool is not stopped, and its own result, when it comes, is kept in the ledger as the
call's late result. The model gets it by calling ``unstuck_result`` with the call id, which
waits for it as long as the client waits, or answers ``still_running`` again.

Which calls are waiting is held by the door process (:class:`StillRunningCalls`, the newest
:data:`MAX_REMEMBERED`): a restarted door no longer knows them, and says so. Nothing here does
I/O or reads the clock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

import mcp_types as types

from workers.core.models import SyntheticReason, TextBlock, ToolCall, ToolResult
from workers.core.results import synthetic_result
from workers.errors import ConfigError
from workers.servers.mcp_sessions import CallTarget
from workers.settings import McpSettings

__all__ = [
    "MAX_REMEMBERED",
    "RESULT_TOOL",
    "StillRunningCall",
    "StillRunningCalls",
    "answer_within_s",
    "fetched_result",
    "not_ready_result",
    "result_tool_entry",
    "still_running_result",
    "unknown_call_result",
    "wanted_call_id",
]

RESULT_TOOL: Final = "unstuck_result"
MAX_REMEMBERED: Final = 4096

_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "call_id": {"type": "string", "description": "the call_id a still_running answer named"},
    },
    "required": ["call_id"],
    "additionalProperties": False,
}


def answer_within_s(mcp: McpSettings) -> float:
    """How long after a request arrives the door answers it at the latest.

    Raises:
        ConfigError: the margin does not leave the door any time before the client's timeout.
    """
    if mcp.answer_margin_s >= mcp.client_timeout_s:
        raise ConfigError([("mcp.answer_margin_s", "must be less than mcp.client_timeout_s")])
    return mcp.client_timeout_s - mcp.answer_margin_s


@dataclass(frozen=True)
class StillRunningCall:
    """A call answered ``still_running``: where its late result will be, and what it ran."""

    target: CallTarget
    tool_name: str
    started_ms: int


class StillRunningCalls:
    """The calls answered ``still_running`` by this door, the newest ``limit`` of them."""

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self._limit = limit
        self._calls: OrderedDict[str, StillRunningCall] = OrderedDict()

    def add(self, call: StillRunningCall) -> None:
        """Remember ``call`` (the oldest is forgotten past the limit)."""
        self._calls[call.target.call_id] = call
        self._calls.move_to_end(call.target.call_id)
        while len(self._calls) > self._limit:
            self._calls.popitem(last=False)

    def get(self, call_id: str) -> StillRunningCall | None:
        """The call answered ``still_running`` with this id, or None."""
        return self._calls.get(call_id)


def result_tool_entry() -> types.Tool:
    """The ``unstuck_result`` entry of ``tools/list``."""
    return types.Tool(
        name=RESULT_TOOL,
        description="Get the result of a tool call that was answered still_running: pass its call_id. "
        "Waits for it while the tool runs (up to the client's timeout), then answers still_running again.",
        input_schema=_SCHEMA,
        annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True),
    )


def wanted_call_id(arguments: dict[str, Any]) -> str | None:
    """The call id an ``unstuck_result`` call asks for, or None when its arguments are not one."""
    value = arguments.get("call_id")
    if set(arguments) != {"call_id"} or not isinstance(value, str) or not value.strip():
        return None
    return value.strip()


def still_running_result(call: ToolCall, *, elapsed_ms: int, attempt: int) -> ToolResult:
    """The answer to a call the client would otherwise give up on: running, fetch it later."""
    detail = (
        f" after {elapsed_ms / 1000:.0f}s, longer than the MCP client waits for an answer; "
        f'get its result with the {RESULT_TOOL} tool and {{"call_id": "{call.id}"}}'
    )
    return synthetic_result(
        call,
        SyntheticReason.STILL_RUNNING,
        elapsed_ms=elapsed_ms,
        attempt=attempt,
        detail=detail,
        extra={"call_id": call.id, "result_tool": RESULT_TOOL},
    )


def fetched_result(asking: ToolCall, waited: StillRunningCall, late: ToolResult) -> ToolResult:
    """The late result of ``waited``, as the answer to the ``unstuck_result`` call ``asking``."""
    return ToolResult(
        tool_call_id=asking.id,
        tool_name=asking.name,
        content=late.content,
        is_error=late.is_error,
        details={**late.details, "result_of": waited.target.call_id, "tool": waited.tool_name},
    )


def not_ready_result(asking: ToolCall, waited: StillRunningCall, *, now_ms: int) -> ToolResult:
    """``waited`` has no result yet: ``still_running`` again, for the ``unstuck_result`` call."""
    call = ToolCall(id=asking.id, name=waited.tool_name, arguments={})
    detail = (
        f" after {(now_ms - waited.started_ms) / 1000:.0f}s; call {RESULT_TOOL} again later with "
        f'{{"call_id": "{waited.target.call_id}"}}'
    )
    result = synthetic_result(
        call,
        SyntheticReason.STILL_RUNNING,
        elapsed_ms=now_ms - waited.started_ms,
        attempt=0,
        detail=detail,
        extra={"call_id": waited.target.call_id, "result_tool": RESULT_TOOL},
    )
    return result.model_copy(update={"tool_name": asking.name})


def unknown_call_result(asking: ToolCall, call_id: str | None) -> ToolResult:
    """No call answered ``still_running`` by this door has ``call_id`` (or none was given)."""
    if call_id is None:
        text = f'{RESULT_TOOL} needs {{"call_id": "<id>"}}: the call_id a still_running answer named.'
    else:
        text = (
            f"No call {call_id!r} is waiting for its result here: only calls answered still_running "
            "by this server can be fetched (a restarted server forgets them). Do not assume it ran."
        )
    return ToolResult(
        tool_call_id=asking.id,
        tool_name=asking.name,
        content=(TextBlock(text=text),),
        is_error=True,
        details={"synthetic": True, "reason": SyntheticReason.INVALID_ARGUMENTS.value, "result_of": call_id},
    )
