"""The LangGraph adapter in LangGraph's own agent loop, with a scripted fake chat model (no network).

The model asks, in one turn, for a healthy tool, a hung one and one that does not exist; the
graph's ``ToolNode`` (``unstuck_tool_node``) sends all three through unstuck. Each gets its
one ``ToolMessage`` (the hung one by its deadline plus grace), the model then answers, and
the ledger holds every call.
"""

from __future__ import annotations

import importlib.util
import time

import pytest

from tests.harness import Proc
from workers.gateway.client import ToolGateway

# LangChain loads in the tests (tests/integration/langgraph_loop.py), not at collection.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("langgraph") is None, reason="langgraph not installed"
)


@pytest.mark.timeout(90)
async def test_a_langgraph_agent_loop_routes_every_call_through_unstuck_async(
    worker: Proc, agateway: ToolGateway
) -> None:
    from langchain_core.messages import HumanMessage

    from tests.integration.langgraph_loop import check, graph, model

    scripted = model()
    state = await graph(scripted, agateway, "async").ainvoke({"messages": [HumanMessage("go")]})
    check(state["messages"], agateway, "async", time.time())
    assert {t["function"]["name"] for t in scripted.bound} >= {"echo", "sleepy"}


@pytest.mark.timeout(90)
def test_a_langgraph_agent_loop_routes_every_call_through_unstuck_sync(
    worker: Proc, gateway: ToolGateway
) -> None:
    from langchain_core.messages import HumanMessage

    from tests.integration.langgraph_loop import check, graph, model

    state = graph(model(), gateway, "sync").invoke({"messages": [HumanMessage("go")]})
    check(state["messages"], gateway, "sync", time.time())


@pytest.mark.timeout(60)
def test_a_tool_invoked_on_its_own_returns_the_text(worker: Proc, gateway: ToolGateway) -> None:
    from workers.adapters.langgraph import unstuck_tools

    [echo] = unstuck_tools(gateway, "lg", "plain", names=["echo"])
    assert echo.invoke({"text": "x", "times": 2}) == "xx"
    invalid = echo.invoke({"times": "many"})
    assert "arguments for tool 'echo' are invalid" in invalid
