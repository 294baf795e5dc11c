"""Tool-call input sanitisation and result ``details`` stripping."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from workers.core.transcript.model import (
    CALL_BLOCK_TYPES,
    CALL_ID_KEYS,
    SNAKE_CALL_BLOCK_TYPES,
    Block,
)
from workers.core.transcript.report import InputReport

__all__ = ["SanitizedInputs", "StrippedDetails", "sanitize_tool_call_inputs", "strip_result_details"]

_NAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9_:.-]+$")
_MAX_NAME_CHARS: Final = 64
_SANITIZED_TYPES: Final = CALL_BLOCK_TYPES | SNAKE_CALL_BLOCK_TYPES


@dataclass(frozen=True)
class SanitizedInputs:
    """The sanitised messages (the input list itself when nothing changed) and the counts."""

    messages: list[Any]
    report: InputReport


@dataclass(frozen=True)
class StrippedDetails:
    """The messages without result ``details`` and how many results had them."""

    messages: list[Any]
    stripped: int


def sanitize_tool_call_inputs(
    messages: list[Any], *, allowed_tool_names: Iterable[str] | None = None
) -> SanitizedInputs:
    """Drop tool-call blocks no provider would accept, and assistant turns left empty by that.

    A block goes when it has no input, no id, a bad or disallowed name, or is an unfinished
    streaming block. Kept blocks get their name trimmed; every other field and block is kept.
    """
    allowed = frozenset(n.strip().lower() for n in allowed_tool_names or () if n.strip())
    output: list[Any] = []
    dropped_calls = dropped_messages = trimmed = 0
    changed = False
    for message in messages:
        if not _is_assistant_with_blocks(message):
            output.append(message)
            continue
        kept: list[Any] = []
        for block in message["content"]:
            if not isinstance(block, dict) or block.get("type") not in _SANITIZED_TYPES:
                kept.append(block)
            elif (clean := _clean_call(block, message.get("stopReason"), allowed)) is None:
                dropped_calls += 1
            else:
                trimmed += int(clean.get("name") != block.get("name"))
                kept.append(clean)
        if len(kept) == len(message["content"]) and all(
            a is b for a, b in zip(kept, message["content"], strict=True)
        ):
            output.append(message)
        elif not kept:
            changed = True
            dropped_messages += 1
        else:
            changed = True
            output.append({**message, "content": kept})
    report = InputReport(dropped_calls, dropped_messages, trimmed)
    return SanitizedInputs(output if changed else messages, report)


def strip_result_details(messages: list[Any]) -> StrippedDetails:
    """Remove ``details`` from every tool result, so provider payloads never see private markers."""
    output: list[Any] = []
    stripped = 0
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "toolResult" and "details" in message:
            stripped += 1
            message = {key: value for key, value in message.items() if key != "details"}
        output.append(message)
    return StrippedDetails(output if stripped else messages, stripped)


def _is_assistant_with_blocks(message: object) -> bool:
    return (
        isinstance(message, dict)
        and message.get("role") == "assistant"
        and isinstance(message.get("content"), list)
    )


def _clean_call(block: Block, stop_reason: object, allowed: frozenset[str]) -> Block | None:
    if not _has_input(block) or _call_id(block) is None:
        return None
    name = block.get("name")
    if not isinstance(name, str) or not _name_ok(name.strip(), allowed):
        return None
    clean = block if name == name.strip() else {**block, "name": name.strip()}
    if isinstance(block.get("partialJson"), str):
        if not _finished_streaming_block(block, stop_reason):
            return None
        clean = {key: value for key, value in clean.items() if key != "partialJson"}
    return clean


def _has_input(block: Block) -> bool:
    return block.get("input") is not None or block.get("arguments") is not None


def _call_id(block: Block) -> str | None:
    value = block.get("id")  # the canonical key, first of the aliases: a fast path
    if isinstance(value, str) and value.strip():
        return value
    for key in CALL_ID_KEYS:
        value = block.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return None


@functools.lru_cache(maxsize=4096)  # a transcript uses a handful of names thousands of times
def _name_ok(name: str, allowed: frozenset[str]) -> bool:
    if not name or len(name) > _MAX_NAME_CHARS or not _NAME_PATTERN.match(name):
        return False
    return not allowed or name.lower() in allowed


def _finished_streaming_block(block: Block, stop_reason: object) -> bool:
    call_id = _call_id(block) or ""
    head, bar, tail = call_id.partition("|")
    arguments = block.get("arguments")
    if stop_reason != "toolUse" or not (bar and head and tail):
        return False
    if not isinstance(arguments, dict) or "input" in block:
        return False
    partial = str(block["partialJson"])
    if not partial.strip():
        return arguments == {}
    try:
        parsed = json.loads(partial)
    except ValueError:
        return False
    return isinstance(parsed, dict)
