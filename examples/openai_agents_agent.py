"""An OpenAI Agents SDK run whose tool calls all go through unstuck (`unstuck[openai-agents]`).

Runs without network: a scripted ``Model`` asks for one healthy call, one with arguments
that are not JSON and one to a tool the agent does not have. Start a stack first
(``UNSTUCK_TOOLS__BUILTINS=exec unstuck up``), then ``python examples/openai_agents_agent.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, ModelResponse, Runner, Tool, Usage
from agents.models.interface import Model
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from workers import ToolGateway
from workers.adapters.openai_agents import unstuck_function_tools, unstuck_run_config


def _call(call_id: str, name: str, arguments: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(type="function_call", call_id=call_id, name=name, arguments=arguments)


class ScriptedModel(Model):
    """Stands in for a real model: returns the scripted outputs turn by turn."""

    def __init__(self, turns: list[list[Any]]) -> None:
        self.turns = turns

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


async def main() -> None:
    gateway = ToolGateway()
    done = ResponseOutputMessage(
        type="message",
        id="m1",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text="done", annotations=[])],
    )
    model = ScriptedModel(
        [
            [
                _call("c1", "exec", '{"command": "echo hello from unstuck"}'),
                _call("c2", "exec", "{not json"),
                _call("c3", "no_such_tool", "{}"),
            ],
            [done],
        ]
    )
    tools: list[Tool] = [*unstuck_function_tools(gateway, "example-oa", "r1")]
    agent = Agent(name="example", instructions="say hello", model=model, tools=tools)
    config = unstuck_run_config(gateway, "example-oa", "r1", tracing_disabled=True)
    result = await Runner.run(agent, "say hello", run_config=config)
    for item in result.new_items:
        print(f"{item.type}: {getattr(item, 'output', '')!s}"[:200])
    print("final:", result.final_output)
    gateway.end_run("example-oa", "r1")
    await gateway.aclose()


if __name__ == "__main__":
    asyncio.run(main())
