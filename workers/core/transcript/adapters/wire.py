"""Helpers shared by the provider adapters: envelopes, typed reads with JSON paths, text shapes."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from workers.core.transcript.model import CALL_BLOCK_TYPES, Block, Message, result_id
from workers.errors import TranscriptRepairError

__all__ = [
    "CallIndex",
    "decode_arguments",
    "encode_arguments",
    "pick",
    "require_dict",
    "require_list",
    "require_str",
    "single_text",
    "split_text_blocks",
    "unwrap",
    "wrap",
]


def unwrap(document: object, key: str) -> tuple[list[Any], str]:
    """The message list of a document that is either the list or an object holding it under ``key``."""
    if isinstance(document, list):
        return document, "$"
    if isinstance(document, dict) and isinstance(document.get(key), list):
        return document[key], f"$.{key}"
    raise TranscriptRepairError("$", f'expected an array or an object with a "{key}" array')


def wrap(document: object, key: str, messages: list[Any]) -> Any:
    """Put ``messages`` back into the same envelope ``document`` had."""
    if isinstance(document, dict):
        return {**document, key: messages}
    return messages


def require_dict(value: object, path: str) -> dict[str, Any]:
    """``value`` if it is a JSON object; raises with ``path`` otherwise."""
    if not isinstance(value, dict):
        raise TranscriptRepairError(path, "expected an object")
    return value


def require_list(value: object, path: str) -> list[Any]:
    """``value`` if it is a JSON array; raises with ``path`` otherwise."""
    if not isinstance(value, list):
        raise TranscriptRepairError(path, "expected an array")
    return value


def require_str(value: object, path: str) -> str:
    """``value`` if it is a JSON string; raises with ``path`` otherwise."""
    if not isinstance(value, str):
        raise TranscriptRepairError(path, "expected a string")
    return value


def pick(source: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """The entries of ``source`` whose key is in ``keys``, in ``source`` order."""
    wanted = set(keys)
    return {key: value for key, value in source.items() if key in wanted}


def decode_arguments(raw: str) -> Any:
    """Parsed arguments when they re-encode to exactly ``raw``; otherwise ``raw`` itself (lossless)."""
    try:
        parsed = json.loads(raw)
    except ValueError:
        return raw
    return parsed if isinstance(parsed, dict) and encode_arguments(parsed) == raw else raw


def encode_arguments(arguments: object) -> str:
    """The JSON-string form of call arguments that chat-style APIs expect."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps({} if arguments is None else arguments, ensure_ascii=False, separators=(",", ":"))


def single_text(content: object) -> str | None:
    """The text of content that is exactly one plain text block, else None."""
    if isinstance(content, list) and len(content) == 1:
        block = content[0]
        if isinstance(block, dict) and block.keys() == {"type", "text"} and block["type"] == "text":
            text = block["text"]
            return text if isinstance(text, str) else None
    return None


def split_text_blocks(content: object) -> tuple[list[Block], list[Block]]:
    """An assistant's blocks split into tool calls and everything else, each in content order."""
    calls: list[Block] = []
    others: list[Block] = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict):
            (calls if block.get("type") in CALL_BLOCK_TYPES else others).append(block)
    return calls, others


class CallIndex:
    """Tool names by call id, for formats whose results do not carry the name.

    An id two calls share names neither: a guessed name would let pairing, which prefers the
    call whose name a result carries, attach the result to the wrong one of them.
    """

    def __init__(self) -> None:
        self._names: dict[str, str | None] = {}

    def add(self, call_id: object, name: object) -> None:
        """Remember the name of a call."""
        if isinstance(call_id, str) and isinstance(name, str):
            self._names[call_id] = None if call_id in self._names else name

    def name_for(self, call_id: object) -> str | None:
        """The name of the only call with this id seen so far, else None."""
        return self._names.get(call_id) if isinstance(call_id, str) else None

    def result_name(self, message: Message) -> str | None:
        """The name a result's call had, for a neutral result."""
        return self.name_for(result_id(message))
