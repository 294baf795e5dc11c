"""The OpenAI Agents SDK adapter in the SDK's own agent loop, with a scripted fake model (no network).

The model asks, in one turn, for a healthy tool, a hung one, one with arguments that are not
JSON, and one the agent does not have; the SDK's runner invokes the unstuck function tools
and (through ``unstuck_run_config``) takes the unknown tool's answer from unstuck. Each call
gets its one output (the hung one by its deadline plus grace), and the ledger holds all four.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, ModelResponse, Runner, Tool, Usage
from agents.items import ToolCallOutputItem
from agents.models.interface import Model
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from tests.harness import Proc
from workers.adapters.openai_agents import unstuck_function_tools, unstuck_run_config
from workers.gateway.client import ToolGateway
from workers.store.records import CallField

SLACK_S = 3.0


def _call(call_id: str, name: str, arguments: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", id=f"fc-{call_id}", call_id=call_id, name=name, arguments=arguments
    )


def _text(text: str) -> ResponseOutputMessage:
    content = [ResponseOutputText(type="output_text", text=text, annotations=[])]
    return ResponseOutputMessage(
        type="message", id="m1", role="assistant", status="completed", content=content
    )


class ScriptedModel(Model):
    """Returns the scripted outputs turn by turn; records the tools it was offered."""

    def __init__(self, turns: list[list[Any]]) -> None:
        self.turns = turns
        self.offered: list[str] = []

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        tools = kwargs.get("tools", args[3] if len(args) > 3 else [])
        self.offered = [tool.name for tool in tools]
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")


@pytest.mark.timeout(90)
async def test_an_agents_sdk_run_routes_every_call_through_unstuck(
    worker: Proc, agateway: ToolGateway
) -> None:
    turn = [
        _call("oa-echo", "echo", '{"text": "hi"}'),
        _call("oa-hung", "sleepy", '{"seconds": 60}'),
        _call("oa-bad", "echo", "{not json"),
        _call("oa-nope", "no_such_tool", "{}"),
    ]
    model = ScriptedModel([turn, [_text("done")]])
    tools: list[Tool] = [*unstuck_function_tools(agateway, "oa", "r1")]
    agent = Agent(name="a", instructions="use tools", model=model, tools=tools)
    config = unstuck_run_config(agateway, "oa", "r1", tracing_disabled=True)

    result = await Runner.run(agent, "go", run_config=config)
    finished_s = time.time()

    outputs = {
        str(item.raw_item.get("call_id")): str(item.output)
        for item in result.new_items
        if isinstance(item, ToolCallOutputItem) and isinstance(item.raw_item, dict)
    }
    assert outputs["oa-echo"] == "hi"
    assert "time limit" in outputs["oa-hung"] or "deadline" in outputs["oa-hung"]
    assert "arguments for tool 'echo' are invalid" in outputs["oa-bad"]
    assert "Unknown tool: 'no_such_tool'" in outputs["oa-nope"]
    assert result.final_output == "done"
    assert {"echo", "sleepy"} <= set(model.offered)

    ledger = agateway._rt.ledger
    keys = ledger.keys("oa", "r1")
    assert sorted(ledger.run_call_ids(keys)) == ["oa-bad", "oa-echo", "oa-hung", "oa-nope"]
    reasons = {cid: ledger.record(keys, cid).result.reason for cid in ("oa-hung", "oa-bad", "oa-nope")}  # type: ignore[union-attr]
    assert reasons["oa-hung"] in {"timeout_soft", "deadline_exceeded"}
    assert reasons["oa-bad"] == "invalid_arguments"
    assert reasons["oa-nope"] == "unknown_tool"
    record = ledger.record(keys, "oa-hung")
    assert record is not None
    grace_s = agateway.settings.gateway.grace_s
    assert finished_s <= record.row.integer(CallField.DEADLINE_MS) / 1000 + grace_s + SLACK_S
