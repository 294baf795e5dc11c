"""LangGraph / LangChain tools whose every call goes through unstuck (``unstuck[langgraph]``).

:func:`unstuck_tools` gives LangChain ``BaseTool`` s (for ``ToolNode``, ``create_react_agent``
or ``model.bind_tools``) built from the registered tools' definitions. Invoking one, sync or
async, submits the call to the gateway and returns its one result: a ``ToolMessage`` (status
``error`` for synthetic and tool errors, the neutral result as ``artifact``) when invoked with
a model's tool call, else the result's text. Hung tools are answered by their deadline, a
loop abort by the loop detector comes back as the call's result, never as an exception.

:func:`unstuck_tool_node` is a ``ToolNode`` that also routes calls to names it does not know
through unstuck, so a hallucinated tool gets unstuck's ``unknown_tool`` answer (with the
closest names) and is recorded in the ledger like any call.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import ConfigDict, Field

try:
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import BaseTool
    from langgraph.prebuilt import ToolNode
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.types import Command
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("the LangGraph adapter needs `pip install 'unstuck[langgraph]'`") from exc

from workers.adapters.listing import ListedTool, listed_tools
from workers.core.models import ToolCall, ToolResult
from workers.errors import LoopDetected
from workers.gateway.client import ToolGateway

__all__ = ["UnstuckTool", "unstuck_tool_node", "unstuck_tools"]

_CALL_ID = "__unstuck_call_id"  # how the model's tool call id reaches _run (never a tool argument)


class UnstuckTool(BaseTool):
    """A registered unstuck tool as a LangChain tool: each invocation is one gateway call."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    gateway: ToolGateway = Field(exclude=True)
    session_key: str
    run_id: str
    agent_id: str = "main"

    def _to_args_and_kwargs(
        self, tool_input: str | dict[str, Any], tool_call_id: str | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args, kwargs = super()._to_args_and_kwargs(tool_input, tool_call_id)
        return args, {**kwargs, _CALL_ID: tool_call_id}

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        call, from_model = self._call(args, kwargs)
        try:
            [result] = self.gateway.call_tools(
                session_key=self.session_key, run_id=self.run_id, agent_id=self.agent_id, calls=[call]
            )
        except LoopDetected as exc:
            [result] = exc.results
        return _output(result, from_model)

    async def _arun(self, *args: Any, **kwargs: Any) -> Any:
        call, from_model = self._call(args, kwargs)
        try:
            [result] = await self.gateway.acall_tools(
                session_key=self.session_key, run_id=self.run_id, agent_id=self.agent_id, calls=[call]
            )
        except LoopDetected as exc:
            [result] = exc.results
        return _output(result, from_model)

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[ToolCall, bool]:
        call_id = kwargs.pop(_CALL_ID, None)
        kwargs.pop("run_manager", None)
        arguments = dict(kwargs) if not args else {"input": args[0], **kwargs}
        # Invoked without a model's tool call (tool.invoke({...})): a fresh id, a plain answer.
        call = ToolCall(id=call_id or f"lc-{uuid.uuid4().hex[:16]}", name=self.name, arguments=arguments)
        return call, call_id is not None


def _output(result: ToolResult, from_model: bool) -> Any:
    if not from_model:
        return result.text
    return ToolMessage(
        content=result.text,
        tool_call_id=result.tool_call_id,
        name=result.tool_name,
        status="error" if result.is_error else "success",
        artifact=result.to_neutral(),
    )


def unstuck_tools(
    gateway: ToolGateway,
    session_key: str,
    run_id: str,
    *,
    agent_id: str = "main",
    names: Sequence[str] | None = None,
) -> list[BaseTool]:
    """The registered tools (or ``names``; only those ``agent_id`` may call) as LangChain tools."""
    return [
        _tool(gateway, session_key, run_id, agent_id, tool)
        for tool in listed_tools(gateway, agent_id=agent_id, names=names)
    ]


def _tool(
    gateway: ToolGateway, session_key: str, run_id: str, agent_id: str, tool: ListedTool
) -> UnstuckTool:
    return UnstuckTool(
        name=tool.name,
        description=tool.description,
        args_schema=tool.parameters,
        gateway=gateway,
        session_key=session_key,
        run_id=run_id,
        agent_id=agent_id,
    )


def unstuck_tool_node(
    gateway: ToolGateway,
    session_key: str,
    run_id: str,
    *,
    agent_id: str = "main",
    names: Sequence[str] | None = None,
) -> ToolNode:
    """A ``ToolNode`` of :func:`unstuck_tools` that sends unknown tool names through unstuck too."""

    def stranger(request: ToolCallRequest) -> UnstuckTool:
        name = str(request.tool_call["name"])
        return _tool(gateway, session_key, run_id, agent_id, ListedTool(name, name))

    def wrap(
        request: ToolCallRequest, execute: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
    ) -> ToolMessage | Command[Any]:
        if request.tool is not None:
            return execute(request)
        message: ToolMessage = stranger(request).invoke(request.tool_call)
        return message

    async def awrap(
        request: ToolCallRequest, execute: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]
    ) -> ToolMessage | Command[Any]:
        if request.tool is not None:
            return await execute(request)
        message: ToolMessage = await stranger(request).ainvoke(request.tool_call)
        return message

    tools = unstuck_tools(gateway, session_key, run_id, agent_id=agent_id, names=names)
    return ToolNode(tools, wrap_tool_call=wrap, awrap_tool_call=awrap)
