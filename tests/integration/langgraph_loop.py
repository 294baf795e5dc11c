"""LangGraph's side of ``test_adapter_langgraph``: a scripted fake chat model, the graph, the checks.

Imported by the tests themselves, so collecting the suite does not load LangChain.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from pydantic import Field

from workers.adapters.langgraph import unstuck_tool_node, unstuck_tools
from workers.gateway.client import ToolGateway
from workers.store.records import CallField

SLACK_S = 3.0

__all__ = ["check", "graph", "model"]

TURN = AIMessage(
    content="",
    tool_calls=[
        {"id": "lg-echo", "name": "echo", "args": {"text": "hi"}},
        {"id": "lg-hung", "name": "sleepy", "args": {"seconds": 60}},
        {"id": "lg-nope", "name": "no_such_tool", "args": {"x": 1}},
    ],
)


class ScriptedModel(BaseChatModel):
    """Answers with the scripted messages in order; records the tools it was bound to."""

    script: list[AIMessage]
    bound: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedModel:
        self.bound = [convert_to_openai_tool(tool) for tool in tools]
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.script.pop(0))])


def graph(model: ScriptedModel, gateway: ToolGateway, run_id: str) -> Any:
    bound = model.bind_tools(unstuck_tools(gateway, "lg", run_id))
    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [bound.invoke(state["messages"])]})
    graph.add_node("tools", unstuck_tool_node(gateway, "lg", run_id))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile()


def check(messages: list[BaseMessage], gateway: ToolGateway, run_id: str, finished_s: float) -> None:
    answers = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    assert set(answers) == {"lg-echo", "lg-hung", "lg-nope"}
    assert (answers["lg-echo"].content, answers["lg-echo"].status) == ("hi", "success")
    hung = answers["lg-hung"]
    assert hung.status == "error"
    assert hung.artifact["details"]["reason"] in {"timeout_soft", "deadline_exceeded"}
    nope = answers["lg-nope"]
    assert nope.status == "error"
    assert nope.artifact["details"]["reason"] == "unknown_tool"
    assert "Unknown tool: 'no_such_tool'" in str(nope.content)
    assert messages[-1].content == "done"
    ledger = gateway._rt.ledger
    keys = ledger.keys("lg", run_id)
    assert sorted(ledger.run_call_ids(keys)) == ["lg-echo", "lg-hung", "lg-nope"]  # run in parallel
    record = ledger.record(keys, "lg-hung")
    assert record is not None
    grace_s = gateway.settings.gateway.grace_s
    assert finished_s <= record.row.integer(CallField.DEADLINE_MS) / 1000 + grace_s + SLACK_S


def model() -> ScriptedModel:
    return ScriptedModel(script=[TURN.model_copy(), AIMessage(content="done")])
