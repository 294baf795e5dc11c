"""Gemini ``contents`` <-> neutral transcript.

Gemini pairs a ``functionResponse`` with its ``functionCall`` by position in the turn right after
the calls; ids are optional. A call without an id gets ``gemini-<turn>-<part>`` in the neutral
form (marked ``geminiImplicitId`` so the id is not sent back). In the turn right after a call
turn, the k-th id-less response of a name answers the k-th call of that name (plain position
wherever the names line up); responses past the calls of their name are extras, which pairing
drops unless one replaces a placeholder of that turn. Anywhere else, or when no call of the turn
has its name, a response stays without an id, so that pairing moves it only when exactly one
unanswered call has its name.
"""

from __future__ import annotations

from typing import Any, Final

from workers.core.transcript.adapters.wire import pick, require_dict, require_list, require_str
from workers.core.transcript.model import (
    CALL_BLOCK_TYPES,
    IMPLICIT_ID,
    Block,
    Message,
    is_synthetic,
    raw_result_id,
)
from workers.errors import TranscriptRepairError

__all__ = ["IMPLICIT_ID", "from_neutral", "model_content_in", "response_part", "to_neutral"]

_IMPLICIT: Final = IMPLICIT_ID  # a call's id was generated (``gemini-<turn>-<part>``), not sent by Gemini
_PART: Final = "geminiPart"
_RESPONSE: Final = "geminiResponse"
_SIGNATURE: Final = ("thoughtSignature",)


def to_neutral(contents: list[Any], path: str = "$") -> list[Message]:
    """Neutral messages for a Gemini ``contents`` array."""
    output: list[Message] = []
    previous_calls: list[Block] = []
    idless_names: set[str] = set()  # names of the calls so far that came without an id
    for index, raw in enumerate(contents):
        where = f"{path}[{index}]"
        content = require_dict(raw, where)
        parts = require_list(content.get("parts"), f"{where}.parts")
        role = content.get("role", "user")
        if role == "model":
            output.append(_model_in(parts, where, index))
            previous_calls = [b for b in output[-1]["content"] if b.get("type") == "toolCall"]
            idless_names.update(b["name"] for b in previous_calls if b.get(_IMPLICIT))
        elif role == "user":
            output.extend(_user_in(parts, f"{where}.parts", previous_calls, idless_names))
            previous_calls = []
        else:
            raise TranscriptRepairError(f"{where}.role", 'expected "user" or "model"')
    return output


def model_content_in(content: object, path: str = "$", turn: int | str = 0) -> Message:
    """One model Content in the neutral form; a call without an id gets ``gemini-<turn>-<part>``.

    Raises:
        TranscriptRepairError: the Content or a part is malformed, or its role is not ``model``.
    """
    raw = require_dict(content, path)
    if raw.get("role", "model") != "model":
        raise TranscriptRepairError(f"{path}.role", 'expected "model"')
    return _model_in(require_list(raw.get("parts"), f"{path}.parts"), path, turn)


def response_part(message: Message, name: str, call_id: str | None) -> dict[str, Any]:
    """The ``functionResponse`` part of a neutral result: the one Gemini encoder.

    ``call_id`` None leaves the id out, for a call that came without one (Gemini then pairs
    the response with its call by name and order).
    """
    content = message.get("content")
    if isinstance(content, list) and len(content) == 1 and _is_response_block(content[0]):
        body = content[0]["response"]
    else:
        blocks = content if isinstance(content, list) else [{"type": "text", "text": str(content or "")}]
        text = "\n".join(b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text")
        body = {"error" if message.get("isError") else "output": text}
    response = {"name": name, "response": body}
    return {"functionResponse": response | ({} if call_id is None else {"id": call_id})}


def from_neutral(messages: list[Message]) -> list[dict[str, Any]]:
    """A Gemini ``contents`` array; consecutive function responses share one user turn."""
    output: list[dict[str, Any]] = []
    calls = [b for m in messages for b in _blocks(m) if b.get("type") in CALL_BLOCK_TYPES]
    names = {b.get("id"): b.get("name") for b in calls}
    # Results repair invented carry no marker of their own, so id-less calls are looked up here.
    implicit = {b.get("id") for b in calls if b.get(_IMPLICIT)}
    index = 0
    while index < len(messages):
        message = messages[index]
        role = message.get("role")
        index += 1
        if role == "assistant":
            output.append({"role": "model", "parts": [_model_part_out(b) for b in _blocks(message)]})
        elif role == "user":
            output.append({"role": "user", "parts": _user_parts_out(message.get("content"))})
        elif role == "toolResult":
            parts = [_response_out(message, names, implicit)]
            while index < len(messages) and messages[index].get("role") == "toolResult":
                parts.append(_response_out(messages[index], names, implicit))
                index += 1
            if index < len(messages) and messages[index].get("role") == "user":
                parts.extend(_user_parts_out(messages[index].get("content")))
                index += 1
            output.append({"role": "user", "parts": parts})
    return output


def _model_in(parts: list[Any], where: str, turn: int | str) -> Message:
    blocks = [_model_part_in(part, f"{where}.parts[{i}]", turn, i) for i, part in enumerate(parts)]
    return {"role": "assistant", "content": blocks}


def _model_part_in(raw: object, where: str, turn: int | str, position: int) -> Block:
    part = require_dict(raw, where)
    if "functionCall" in part:
        call = require_dict(part["functionCall"], f"{where}.functionCall")
        name = require_str(call.get("name"), f"{where}.functionCall.name")
        explicit = call.get("id")
        call_id = require_str(explicit, f"{where}.functionCall.id") if explicit is not None else None
        block: Block = {"type": "toolCall", "id": call_id or f"gemini-{turn}-{position}", "name": name}
        block["arguments"] = call.get("args", {})
        return block | ({_IMPLICIT: True} if call_id is None else {}) | pick(part, _SIGNATURE)
    if isinstance(part.get("text"), str) and part.keys() <= {"text", "thought", "thoughtSignature"}:
        if part.get("thought") is True:
            thinking: Block = {"type": "thinking", "thinking": part["text"]}
            return thinking | (
                {"thinkingSignature": part["thoughtSignature"]} if "thoughtSignature" in part else {}
            )
        if "thought" not in part:
            return {"type": "text", "text": part["text"]} | pick(part, _SIGNATURE)
    return {"type": _PART, "part": part}


def _user_in(
    parts: list[Any], where: str, previous_calls: list[Block], idless_names: set[str]
) -> list[Message]:
    responses: list[tuple[dict[str, Any], str, str | None]] = []
    rest: list[Block] = []
    for i, raw in enumerate(parts):
        part = require_dict(raw, f"{where}[{i}]")
        if "functionResponse" in part:
            responses.append(_response_fields(part["functionResponse"], f"{where}[{i}].functionResponse"))
        elif isinstance(part.get("text"), str) and part.keys() == {"text"}:
            rest.append({"type": "text", "text": part["text"]})
        else:
            rest.append({"type": _PART, "part": part})
    owners = _attribute(responses, previous_calls, idless_names)
    results = [_response_in(fields, owner) for fields, owner in zip(responses, owners, strict=True)]
    if rest or not results:
        results.append({"role": "user", "content": rest})
    return results


def _response_fields(raw: object, where: str) -> tuple[dict[str, Any], str, str | None]:
    response = require_dict(raw, where)
    name = require_str(response.get("name"), f"{where}.name")
    explicit = response.get("id")
    return response, name, require_str(explicit, f"{where}.id") if explicit is not None else None


def _attribute(
    responses: list[tuple[dict[str, Any], str, str | None]], calls: list[Block], idless_names: set[str]
) -> list[str | None]:
    """The call id each response answers, or None where no call of the turn has its name.

    A response with an id answers that call. The id-less ones answer the turn's calls by
    position within their name (only the calls without an id, where that name's calls so far
    have come both with and without one): the k-th
    response of a name answers the k-th call of that name, which is plain position wherever the
    names line up, as Gemini requires. A response past the calls of its name is an extra: it is given, as a
    duplicate, to the first of those calls that holds a placeholder, so that pairing lets a real
    result replace it, else to the last of them, and pairing drops it.
    """
    answered = {explicit for _, _, explicit in responses if explicit is not None}
    free: dict[str, list[str]] = {}
    # A call that carried an id expects its response to carry it too, so where a name's calls
    # mix both kinds the id-less responses answer only the id-less ones; one that follows an
    # id'd call may be a late answer to an earlier id-less call, which pairing then finds by name.
    for call in calls:
        mixed_away = call["name"] in idless_names and not call.get(_IMPLICIT)
        if call["id"] not in answered and not mixed_away:
            free.setdefault(call["name"], []).append(call["id"])
    held: dict[str, list[bool]] = {}  # per name, whether each call answered so far holds a placeholder
    owners: list[str | None] = []
    for fields in responses:
        _, name, explicit = fields
        ids = free.get(name, [])
        if explicit is not None or not ids:
            owners.append(explicit)
            continue
        placeholders = held.setdefault(name, [])
        placeholder = is_synthetic(_response_in(fields, None))
        if len(placeholders) < len(ids):
            owners.append(ids[len(placeholders)])
            placeholders.append(placeholder)
        else:
            owners.append(ids[_extra_slot(placeholders, placeholder)])
    return owners


def _extra_slot(placeholders: list[bool], placeholder: bool) -> int:
    """Which call of its name an extra response duplicates: a placeholder's if it is real, else the last."""
    if not placeholder and True in placeholders:
        slot = placeholders.index(True)
        placeholders[slot] = False  # this real answer replaces that placeholder
        return slot
    return len(placeholders) - 1


def _response_in(fields: tuple[dict[str, Any], str, str | None], call_id: str | None) -> Message:
    response, name, explicit = fields
    result: Message = {"role": "toolResult"}
    if call_id is not None:
        result["toolCallId"] = call_id
    result["toolName"] = name
    implicit = {_IMPLICIT: True} if explicit is None and call_id else {}
    body = response.get("response")
    if isinstance(body, dict) and len(body) == 1 and isinstance(next(iter(body.values())), str):
        key, text = next(iter(body.items()))
        if key in ("output", "error"):
            result |= {"content": [{"type": "text", "text": text}], "isError": key == "error"}
            return result | implicit
    result |= {"content": [{"type": _RESPONSE, "response": body}], "isError": False}
    return result | implicit


def _blocks(message: Message) -> list[Block]:
    content = message.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _model_part_out(block: Block) -> dict[str, Any]:
    kind = block.get("type")
    if kind in CALL_BLOCK_TYPES:
        arguments = block.get("arguments", block.get("input"))
        call = {"name": block.get("name"), "args": {} if arguments is None else arguments}
        call |= {} if block.get(_IMPLICIT) else {"id": block.get("id")}
        return {"functionCall": call} | pick(block, _SIGNATURE)
    if kind == "thinking":
        part = {"text": block.get("thinking", ""), "thought": True}
        return part | (
            {"thoughtSignature": block["thinkingSignature"]} if "thinkingSignature" in block else {}
        )
    return _plain_part_out(block) | pick(block, _SIGNATURE)


def _plain_part_out(block: Block) -> dict[str, Any]:
    kind = block.get("type")
    if kind == _PART:
        return dict(block["part"])
    if kind == "image":
        return {"inlineData": {"mimeType": block.get("mimeType"), "data": block.get("data")}}
    return {"text": block.get("text", "")}


def _user_parts_out(content: object) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}]
    return [_plain_part_out(b) for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _response_out(message: Message, names: dict[Any, Any], implicit: set[Any]) -> dict[str, Any]:
    call_id = raw_result_id(message)
    name = message.get("toolName") or names.get(call_id) or "unknown"
    hide_id = message.get(_IMPLICIT) or call_id is None or call_id in implicit
    return response_part(message, name, None if hide_id else call_id)


def _is_response_block(block: object) -> bool:
    return isinstance(block, dict) and block.get("type") == _RESPONSE
