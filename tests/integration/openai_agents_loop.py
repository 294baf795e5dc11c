"""The OpenAI Agents SDK's side of ``test_adapter_openai_agents``: a scripted fake model and its turns.

Imported by the test itself, so collecting the suite does not load the SDK.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agents import ModelResponse, Usage
from agents.models.interface import Model
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

__all__ = ["ScriptedModel", "function_call", "text_message"]


def function_call(call_id: str, name: str, arguments: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", id=f"fc-{call_id}", call_id=call_id, name=name, arguments=arguments
    )


def text_message(text: str) -> ResponseOutputMessage:
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
