"""Anthropic Messages <-> neutral transcript.

A user message's ``tool_result`` blocks become neutral ``toolResult`` messages; its other blocks
follow as one user message. On the way back a run of results and the user message right after it
become one user message again, which is what Anthropic requires after a ``tool_use`` turn.
"""

from __future__ import annotations

from typing import Any, Final

from workers.core.transcript.adapters.wire import CallIndex, pick, require_dict, require_str
from workers.core.transcript.model import CALL_BLOCK_TYPES, Block, Message, raw_result_id
from workers.errors import TranscriptRepairError

__all__ = ["assistant_in", "from_neutral", "result_block", "to_neutral"]

_CACHE: Final = ("cache_control",)
_TEXT_EXTRAS: Final = ("cache_control", "citations")


def to_neutral(messages: list[Any], path: str = "$") -> list[Message]:
    """Neutral messages for an Anthropic ``messages`` array."""
    calls = CallIndex()
    output: list[Message] = []
    for index, raw in enumerate(messages):
        where = f"{path}[{index}]"
        message = require_dict(raw, where)
        role = message.get("role")
        content = message.get("content")
        if role not in ("user", "assistant"):
            raise TranscriptRepairError(f"{where}.role", 'expected "user" or "assistant"')
        if isinstance(content, str):
            output.append({"role": role, "content": content})
        elif not isinstance(content, list):
            raise TranscriptRepairError(f"{where}.content", "expected a string or an array")
        elif role == "assistant":
            output.append(assistant_in(message, where, calls))
        else:
            output.extend(_user_in(content, f"{where}.content", calls))
    return output


def from_neutral(messages: list[Message]) -> list[dict[str, Any]]:
    """An Anthropic ``messages`` array; roles Anthropic has no place for are left out."""
    output: list[dict[str, Any]] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        role = message.get("role")
        index += 1
        if role == "toolResult":
            blocks = [_result_out(message)]
            while index < len(messages) and messages[index].get("role") == "toolResult":
                blocks.append(_result_out(messages[index]))
                index += 1
            if index < len(messages) and _is_list_user(messages[index]):
                blocks.extend(_block_out(block) for block in messages[index]["content"])
                index += 1
            output.append({"role": "user", "content": blocks})
        elif role in ("user", "assistant"):
            output.append({"role": role, "content": _content_out(message.get("content"))})
    return output


def assistant_in(message: object, path: str = "$", calls: CallIndex | None = None) -> Message:
    """One assistant message in the neutral form: its ``tool_use`` blocks become ``toolCall`` blocks.

    Raises:
        TranscriptRepairError: the message or a block is malformed; ``path`` points at it.
    """
    raw = require_dict(message, path)
    content = raw.get("content")
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise TranscriptRepairError(f"{path}.content", "expected a string or an array")
    index = calls if calls is not None else CallIndex()
    blocks = [_block_in(block, f"{path}.content[{i}]", index) for i, block in enumerate(content)]
    return {"role": "assistant", "content": blocks}


def result_block(message: Message, call_id: str | None) -> dict[str, Any]:
    """The ``tool_result`` block of a neutral result answering ``call_id``: the one Anthropic encoder."""
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
    if "content" in message:
        block["content"] = _content_out(message["content"])
    if isinstance(message.get("isError"), bool):
        block["is_error"] = message["isError"]
    return block | pick(message, _CACHE)


def _user_in(content: list[Any], path: str, calls: CallIndex) -> list[Message]:
    results: list[Message] = []
    rest: list[Block] = []
    for i, raw in enumerate(content):
        block = require_dict(raw, f"{path}[{i}]")
        if block.get("type") == "tool_result":
            results.append(_result_in(block, f"{path}[{i}]", calls))
        else:
            rest.append(_block_in(block, f"{path}[{i}]", calls))
    if rest or not results:
        results.append({"role": "user", "content": rest})
    return results


def _result_in(block: Block, path: str, calls: CallIndex) -> Message:
    call_id = require_str(block.get("tool_use_id"), f"{path}.tool_use_id")
    result: Message = {"role": "toolResult", "toolCallId": call_id}
    if (name := calls.name_for(call_id)) is not None:
        result["toolName"] = name
    if "content" in block:
        content = block["content"]
        result["content"] = (
            [_block_in(b, path, calls) for b in content] if isinstance(content, list) else content
        )
    if "is_error" in block:
        result["isError"] = block["is_error"]
    return result | pick(block, _CACHE)


def _block_in(raw: object, path: str, calls: CallIndex) -> Block:
    block = require_dict(raw, path)
    kind = block.get("type")
    if kind == "tool_use":
        call_id = require_str(block.get("id"), f"{path}.id")
        name = require_str(block.get("name"), f"{path}.name")
        calls.add(call_id, name)
        call = {"type": "toolCall", "id": call_id, "name": name, "arguments": block.get("input")}
        return call | pick(block, _CACHE)
    if kind == "thinking" and isinstance(block.get("thinking"), str):
        thinking: Block = {"type": "thinking", "thinking": block["thinking"]}
        return thinking | ({"thinkingSignature": block["signature"]} if "signature" in block else {})
    if kind == "image" and _is_base64_image(block):
        return {"type": "image", "data": block["source"]["data"], "mimeType": block["source"]["media_type"]}
    return block


def _is_base64_image(block: Block) -> bool:
    source = block.get("source")
    return (
        block.keys() == {"type", "source"}
        and isinstance(source, dict)
        and source.keys() == {"type", "media_type", "data"}
        and source["type"] == "base64"
    )


def _block_out(block: Any) -> Any:
    if not isinstance(block, dict):
        return block
    kind = block.get("type")
    if kind in CALL_BLOCK_TYPES:
        arguments = block.get("arguments", block.get("input"))
        tool_use = {"type": "tool_use", "id": block.get("id"), "name": block.get("name")}
        return tool_use | {"input": {} if arguments is None else arguments} | pick(block, _CACHE)
    if kind == "thinking":
        thinking = {"type": "thinking", "thinking": block.get("thinking", "")}
        return thinking | ({"signature": block["thinkingSignature"]} if "thinkingSignature" in block else {})
    if kind == "text":
        return {"type": "text", "text": block.get("text", "")} | pick(block, _TEXT_EXTRAS)
    if kind == "image" and "data" in block and "mimeType" in block:
        source = {"type": "base64", "media_type": block["mimeType"], "data": block["data"]}
        return {"type": "image", "source": source}
    return block


def _content_out(content: object) -> Any:
    return [_block_out(block) for block in content] if isinstance(content, list) else content


def _result_out(message: Message) -> dict[str, Any]:
    return result_block(message, raw_result_id(message))


def _is_list_user(message: Message) -> bool:
    return message.get("role") == "user" and isinstance(message.get("content"), list)
