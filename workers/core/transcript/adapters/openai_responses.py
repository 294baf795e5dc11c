"""OpenAI Responses input items <-> neutral transcript.

Consecutive assistant-side items (assistant messages, reasoning, function calls) form one neutral
assistant turn. A call's neutral id is its ``call_id``, the id its output answers; the item's own
id rides along in its own field (``responsesItemId``), so both come back exactly, whatever
characters they hold. Items the neutral form has no block for ride along as
``{"type": "responsesItem", "item": ...}`` blocks.
The Responses API has no error flag on outputs, so ``isError`` does not survive a trip out.
"""

from __future__ import annotations

from typing import Any, Final

from workers.core.transcript.adapters.wire import (
    CallIndex,
    decode_arguments,
    encode_arguments,
    pick,
    require_dict,
    require_str,
    single_text,
)
from workers.core.transcript.model import CALL_BLOCK_TYPES, RESPONSES_ITEM_ID, Block, Message, raw_result_id

__all__ = ["from_neutral", "function_call_in", "output_item", "to_neutral"]

_ITEM_KEYS: Final = ("type", "id", "status")
_PASSTHROUGH: Final = "responsesItem"


def to_neutral(items: list[Any], path: str = "$") -> list[Message]:
    """Neutral messages for a Responses ``input`` item list."""
    calls = CallIndex()
    output: list[Message] = []
    turn: list[Block] | None = None
    for index, raw in enumerate(items):
        where = f"{path}[{index}]"
        item = require_dict(raw, where)
        kind, role = item.get("type"), item.get("role")
        if kind == "function_call_output":
            turn = None
            output.append(_output_in(item, where, calls))
        elif role in ("user", "system", "developer"):
            turn = None
            output.append(
                {"role": role, "content": _content_in(item.get("content"))} | pick(item, _ITEM_KEYS)
            )
        else:
            if turn is None:
                turn = []
                output.append({"role": "assistant", "content": turn})
            turn.extend(_assistant_blocks_in(item, where, calls))
    return output


def from_neutral(messages: list[Message]) -> list[dict[str, Any]]:
    """A Responses ``input`` item list."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            items.extend(_assistant_out(message.get("content")))
        elif role == "toolResult":
            items.append(output_item(message, raw_result_id(message) or ""))
        elif role in ("user", "system", "developer"):
            content = _content_out(message.get("content"), "input")
            items.append(
                pick(message, ("type",))
                | {"role": role, "content": content}
                | pick(message, ("id", "status"))
            )
    return items


def output_item(message: Message, call_id: str) -> dict[str, Any]:
    """The ``function_call_output`` item of a neutral result answering ``call_id``: the one encoder."""
    output = single_text(message.get("content"))
    item = {"type": "function_call_output", "call_id": call_id}
    item["output"] = output if output is not None else _content_out(message.get("content"), "input")
    return item | pick(message, ("id", "status"))


def function_call_in(item: dict[str, Any], where: str) -> Block:
    """The neutral ``toolCall`` block of a ``function_call`` item; the item's own id rides along.

    Raises:
        TranscriptRepairError: ``call_id``, ``name`` or ``arguments`` is not a string.
    """
    call_id = require_str(item.get("call_id"), f"{where}.call_id")
    name = require_str(item.get("name"), f"{where}.name")
    arguments = require_str(item.get("arguments"), f"{where}.arguments")
    call = {"type": "toolCall", "id": call_id, "name": name, "arguments": decode_arguments(arguments)}
    item_id = {RESPONSES_ITEM_ID: item["id"]} if isinstance(item.get("id"), str) else {}
    return call | item_id | pick(item, ("status",))


def _output_in(item: dict[str, Any], where: str, calls: CallIndex) -> Message:
    call_id = require_str(item.get("call_id"), f"{where}.call_id")
    result: Message = {"role": "toolResult", "toolCallId": call_id}
    if (name := calls.name_for(call_id)) is not None:
        result["toolName"] = name
    output = item.get("output")
    result["content"] = [{"type": "text", "text": output}] if isinstance(output, str) else _content_in(output)
    return result | pick(item, ("id", "status"))


def _assistant_blocks_in(item: dict[str, Any], where: str, calls: CallIndex) -> list[Block]:
    if item.get("type") == "function_call":
        call = function_call_in(item, where)
        calls.add(call["id"], call["name"])
        return [call]
    if item.get("role") == "assistant" and isinstance(item.get("content"), list) and item["content"]:
        blocks = _content_in(item["content"])
        if all(isinstance(b, dict) and b.get("type") == "text" for b in blocks):
            envelope = pick(item, _ITEM_KEYS)
            return [blocks[0] | ({_PASSTHROUGH: envelope} if envelope else {}), *blocks[1:]]
    return [{"type": _PASSTHROUGH, "item": item}]


def _assistant_out(content: object) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    text_item: dict[str, Any] | None = None
    for block in content if isinstance(content, list) else []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            part = {"type": "output_text"} | {
                k: v for k, v in block.items() if k not in ("type", _PASSTHROUGH)
            }
            if text_item is None or _PASSTHROUGH in block:
                text_item = block.get(_PASSTHROUGH, {}) | {"role": "assistant", "content": []}
                items.append(text_item)
            text_item["content"].append(part)
            continue
        text_item = None
        if kind in CALL_BLOCK_TYPES:
            items.append(_call_out(block))
        elif kind == _PASSTHROUGH:
            items.append(block["item"])
    return items


def _call_out(block: Block) -> dict[str, Any]:
    call = {"type": "function_call", "call_id": block.get("id"), "name": block.get("name")}
    call["arguments"] = encode_arguments(block.get("arguments", block.get("input")))
    item_id = block.get(RESPONSES_ITEM_ID)
    return call | ({"id": item_id} if isinstance(item_id, str) else {}) | pick(block, ("status",))


def _content_in(content: object) -> Any:
    if not isinstance(content, list):
        return content
    return [
        {"type": "text"} | {k: v for k, v in part.items() if k != "type"}
        if isinstance(part, dict) and part.get("type") in ("input_text", "output_text")
        else part
        for part in content
    ]


def _content_out(content: object, direction: str) -> Any:
    if not isinstance(content, list):
        return content
    return [
        {"type": f"{direction}_text"} | {k: v for k, v in part.items() if k != "type"}
        if isinstance(part, dict) and part.get("type") == "text"
        else part
        for part in content
    ]
