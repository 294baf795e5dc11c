"""OpenAI Agents SDK function tools whose every call goes through unstuck (``unstuck[openai-agents]``).

:func:`unstuck_function_tools` gives ``FunctionTool`` s built from the registered tools'
definitions; the SDK's arguments string is handed to the gateway as an OpenAI Responses
``function_call`` item, so arguments that are not JSON become an ``invalid_arguments``
result, a hung tool is answered by its deadline, and a loop abort is the call's result.

The SDK answers calls to tools the agent lacks itself; :func:`unstuck_run_config` makes it
return that answer to the model (instead of failing the run) and takes it from unstuck, so a
hallucinated tool gets the ``unknown_tool`` result with the closest names and is recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from agents import FunctionTool, RunConfig
    from agents.run_config import ToolErrorFormatterArgs
    from agents.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("the OpenAI Agents SDK adapter needs `pip install 'unstuck[openai-agents]'`") from exc

from workers.adapters.listing import ListedTool, listed_tools
from workers.gateway.client import ToolGateway

__all__ = ["unstuck_function_tools", "unstuck_run_config"]


class _Route:
    """Where a tool call goes: one run of one session, for one agent."""

    def __init__(self, gateway: ToolGateway, session_key: str, run_id: str, agent_id: str) -> None:
        self.gateway = gateway
        self.session_key = session_key
        self.run_id = run_id
        self.agent_id = agent_id

    async def call(self, call_id: str, name: str, arguments: str) -> str:
        item = {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}
        answer = await self.gateway.acall_tools_in(
            "openai-responses",
            [item],
            session_key=self.session_key,
            run_id=self.run_id,
            agent_id=self.agent_id,
        )
        return answer.results[0].text


def unstuck_function_tools(
    gateway: ToolGateway,
    session_key: str,
    run_id: str,
    *,
    agent_id: str = "main",
    names: Sequence[str] | None = None,
) -> list[FunctionTool]:
    """The registered tools (or ``names``; only those ``agent_id`` may call) as SDK function tools."""
    route = _Route(gateway, session_key, run_id, agent_id)
    return [_function_tool(route, tool) for tool in listed_tools(gateway, agent_id=agent_id, names=names)]


def _function_tool(route: _Route, tool: ListedTool) -> FunctionTool:
    name = tool.name

    async def invoke(context: ToolContext[Any], arguments: str) -> str:
        return await route.call(context.tool_call_id, name, arguments)

    return FunctionTool(
        name=name,
        description=tool.description,
        params_json_schema=tool.parameters,
        on_invoke_tool=invoke,
        strict_json_schema=False,  # unstuck validates the arguments itself, answering bad ones
    )


def unstuck_run_config(
    gateway: ToolGateway, session_key: str, run_id: str, *, agent_id: str = "main", **options: Any
) -> RunConfig:
    """A ``RunConfig`` (with ``options``) whose calls to unknown tools are answered by unstuck."""
    route = _Route(gateway, session_key, run_id, agent_id)

    async def formatter(args: ToolErrorFormatterArgs[Any]) -> str | None:
        if args.kind != "tool_not_found":
            return None  # the SDK's own message
        return await route.call(args.call_id, args.tool_name, "{}")

    options.setdefault("tool_not_found_behavior", "return_error_to_model")
    return RunConfig(tool_error_formatter=formatter, **options)
