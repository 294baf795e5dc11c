"""A LangGraph agent loop whose tool calls all go through unstuck (``pip install 'unstuck[langgraph]'``).

Runs without a model provider: a scripted chat model asks for one healthy call and one to a
tool that does not exist. Start a stack first (``UNSTUCK_TOOLS__BUILTINS=exec unstuck up``),
then ``python examples/langgraph_agent.py``.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from workers import ToolGateway
from workers.adapters.langgraph import unstuck_tool_node, unstuck_tools


class ScriptedModel(BaseChatModel):
    """Stands in for a real chat model: answers with the scripted messages in order."""

    script: list[AIMessage]

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self  # a real model would receive the unstuck tools' definitions here

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.script.pop(0))])


def main() -> None:
    gateway = ToolGateway()
    model = ScriptedModel(
        script=[
            AIMessage(
                content="",
                tool_calls=[
                    {"id": "c1", "name": "exec", "args": {"command": "echo hello from unstuck"}},
                    {"id": "c2", "name": "no_such_tool", "args": {}},
                ],
            ),
            AIMessage(content="done"),
        ]
    ).bind_tools(unstuck_tools(gateway, "example-lg", "r1"))

    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_node("tools", unstuck_tool_node(gateway, "example-lg", "r1"))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, ["tools", END])
    graph.add_edge("tools", "agent")

    state = graph.compile().invoke({"messages": [HumanMessage("say hello")]})
    for message in state["messages"]:
        print(f"{message.type:>5}: {message.content!s}"[:200])
    gateway.end_run("example-lg", "r1")
    gateway.close()


if __name__ == "__main__":
    main()
