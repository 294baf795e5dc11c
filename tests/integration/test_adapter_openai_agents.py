"""The OpenAI Agents SDK adapter in the SDK's own agent loop, with a scripted fake model (no network).

The model asks, in one turn, for a healthy tool, a hung one, one with arguments that are not
JSON, and one the agent does not have; the SDK's runner invokes the unstuck function tools
and (through ``unstuck_run_config``) takes the unknown tool's answer from unstuck. Each call
gets its one output (the hung one by its deadline plus grace), and the ledger holds all four.
"""

from __future__ import annotations

import importlib.util
import time

import pytest

from tests.harness import Proc
from workers.gateway.client import ToolGateway
from workers.store.records import CallField

# The SDK loads in the test (tests/integration/openai_agents_loop.py), not at collection.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("agents") is None, reason="openai-agents not installed"
)

SLACK_S = 3.0


@pytest.mark.timeout(90)
async def test_an_agents_sdk_run_routes_every_call_through_unstuck(
    worker: Proc, agateway: ToolGateway
) -> None:
    from agents import Agent, Runner, Tool
    from agents.items import ToolCallOutputItem

    from tests.integration.openai_agents_loop import ScriptedModel, function_call, text_message
    from workers.adapters.openai_agents import unstuck_function_tools, unstuck_run_config

    turn = [
        function_call("oa-echo", "echo", '{"text": "hi"}'),
        function_call("oa-hung", "sleepy", '{"seconds": 60}'),
        function_call("oa-bad", "echo", "{not json"),
        function_call("oa-nope", "no_such_tool", "{}"),
    ]
    model = ScriptedModel([turn, [text_message("done")]])
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
