"""OpenAI Chat Completions <-> neutral transcript.

Assistant text becomes a string when it is one plain text block, ``null`` when there is none;
call arguments stay a JSON string on the wire and an object in the neutral form whenever that
converts back byte for byte.
"""

from __future__ import annotations

from typing import Any, Final

from workers.core.transcript.adapters.wire import (
    CallIndex,
    decode_arguments,
    encode_arguments,
    pick,
    require_dict,
    require_list,
    require_str,
    single_text,
    split_text_blocks,
)
from workers.core.transcript.model import Message, raw_result_id
from workers.errors import TranscriptRepairError

__all__ = ["assistant_in", "from_neutral", "to_neutral", "tool_message"]

_ASSISTANT_EXTRAS: Final = ("name", "refusal", "audio", "reasoning_content")
_PLAIN_ROLES: Final = ("user", "system", "developer")


def to_neutral(messages: list[Any], path: str = "$") -> list[Message]:
    """Neutral messages for a Chat Completions ``messages`` array."""
    calls = CallIndex()
    output: list[Message] = []
    for index, raw in enumerate(messages):
        where = f"{path}[{index}]"
        message = require_dict(raw, where)
        role = require_str(message.get("role"), f"{where}.role")
        if role == "assistant":
            output.append(assistant_in(message, where, calls))
        elif role == "tool":
            output.append(_tool_in(message, where, calls))
        else:
            output.append(dict(message))
    return output


def from_neutral(messages: list[Message]) -> list[dict[str, Any]]:
    """A Chat Completions ``messages`` array."""
    output: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            output.append(_assistant_out(message))
        elif role == "toolResult":
            output.append(tool_message(message, raw_result_id(message)))
        elif role in _PLAIN_ROLES:
            output.append(pick(message, ("role", "content", "name")))
        else:
            output.append(dict(message))
    return output


def tool_message(message: Message, call_id: str | None) -> dict[str, Any]:
    """The ``role: tool`` message of a neutral result answering ``call_id``: the one Chat encoder."""
    tool = {"role": "tool", "tool_call_id": call_id}
    return tool | _content_out(message.get("content", "")) | pick(message, ("name",))


def assistant_in(message: object, where: str = "$", calls: CallIndex | None = None) -> Message:
    """One assistant message in the neutral form; ``tool_calls`` become ``toolCall`` blocks.

    Arguments stay the wire's JSON string unless they convert back byte for byte.

    Raises:
        TranscriptRepairError: the message or a call is malformed; the path points at it.
    """
    raw_message = require_dict(message, where)
    calls = calls if calls is not None else CallIndex()
    content = raw_message.get("content")
    if isinstance(content, str):
        blocks: list[Any] = [{"type": "text", "text": content}]
    elif content is None:
        blocks = []
    else:
        blocks = list(require_list(content, f"{where}.content"))
    tool_calls = raw_message.get("tool_calls")  # SDKs dump a message without calls as null
    for i, raw in enumerate(require_list([] if tool_calls is None else tool_calls, f"{where}.tool_calls")):
        call_path = f"{where}.tool_calls[{i}]"
        call = require_dict(raw, call_path)
        function = require_dict(call.get("function"), f"{call_path}.function")
        call_id = require_str(call.get("id"), f"{call_path}.id")
        name = require_str(function.get("name"), f"{call_path}.function.name")
        arguments = require_str(function.get("arguments"), f"{call_path}.function.arguments")
        calls.add(call_id, name)
        blocks.append(
            {"type": "toolCall", "id": call_id, "name": name, "arguments": decode_arguments(arguments)}
        )
    return {"role": "assistant", "content": blocks} | pick(raw_message, _ASSISTANT_EXTRAS)


def _tool_in(message: dict[str, Any], where: str, calls: CallIndex) -> Message:
    call_id = require_str(message.get("tool_call_id"), f"{where}.tool_call_id")
    content = message.get("content")
    if not isinstance(content, str | list):
        raise TranscriptRepairError(f"{where}.content", "expected a string or an array")
    name = message["name"] if isinstance(message.get("name"), str) else calls.name_for(call_id)
    result: Message = {"role": "toolResult", "toolCallId": call_id}
    if name is not None:
        result["toolName"] = name
    result["content"] = [{"type": "text", "text": content}] if isinstance(content, str) else content
    return result | pick(message, ("name",))


def _assistant_out(message: Message) -> dict[str, Any]:
    calls, others = split_text_blocks(message.get("content"))
    text_parts = [block for block in others if block.get("type") not in ("thinking", "image")]
    assistant: dict[str, Any] = {"role": "assistant"} | _content_out(text_parts, empty=None)
    if calls:
        assistant["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": "function",
                "function": {
                    "name": call.get("name"),
                    "arguments": encode_arguments(call.get("arguments", call.get("input"))),
                },
            }
            for call in calls
        ]
    return assistant | pick(message, _ASSISTANT_EXTRAS)


def _content_out(content: object, empty: str | None = "") -> dict[str, Any]:
    if isinstance(content, str):
        return {"content": content}
    text = single_text(content)
    if text is not None:
        return {"content": text}
    return {"content": content if content else empty}
