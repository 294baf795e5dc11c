"""Shape checks of a neutral transcript read from outside, with the JSON path of each problem."""

from __future__ import annotations

from typing import Any, Final

from workers.core.transcript.model import CALL_BLOCK_TYPES, CALL_ID_KEYS, RESULT_ID_KEYS, Message
from workers.errors import TranscriptRepairError

__all__ = ["validate_transcript"]

_OPTIONAL_STRINGS: Final = {
    "assistant": ("stopReason", "errorMessage"),
    "toolResult": (*RESULT_ID_KEYS, "toolName"),
}


def validate_transcript(value: object) -> list[Message]:
    """Return ``value`` typed as a transcript, or raise on the first malformed part.

    Missing or blank ids and names are left to repair; values of the wrong JSON type are not.

    Raises:
        TranscriptRepairError: ``path`` is the JSON path of the problem, e.g. ``$[3].content[0].id``.
    """
    if not isinstance(value, list):
        raise TranscriptRepairError("$", "expected an array of messages")
    for index, message in enumerate(value):
        _check_message(message, f"$[{index}]")
    return value


def _check_message(message: object, path: str) -> None:
    if not isinstance(message, dict):
        raise TranscriptRepairError(path, "expected an object")
    role = message.get("role")
    if not isinstance(role, str):
        raise TranscriptRepairError(f"{path}.role", "expected a string")
    for key in _OPTIONAL_STRINGS.get(role, ()):
        _optional(message, key, str, f"{path}.{key}", "a string")
    if role == "toolResult":
        _optional(message, "isError", bool, f"{path}.isError", "a boolean")
        _optional(message, "details", dict, f"{path}.details", "an object")
    if role in ("user", "assistant", "toolResult"):
        _check_content(message, role, path)


def _check_content(message: dict[str, Any], role: str, path: str) -> None:
    content = message.get("content")
    if content is None and role == "toolResult":
        return
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise TranscriptRepairError(f"{path}.content", "expected a string or an array of blocks")
    for index, block in enumerate(content):
        _check_block(block, f"{path}.content[{index}]")


def _check_block(block: object, path: str) -> None:
    if not isinstance(block, dict):
        raise TranscriptRepairError(path, "expected an object")
    if not isinstance(block.get("type"), str):
        raise TranscriptRepairError(f"{path}.type", "expected a string")
    if block["type"] in CALL_BLOCK_TYPES:
        for key in CALL_ID_KEYS:
            _optional(block, key, str, f"{path}.{key}", "a string")
    elif block["type"] == "text":
        _optional(block, "text", str, f"{path}.text", "a string")


def _optional(container: dict[str, Any], key: str, kind: type, path: str, expected: str) -> None:
    value = container.get(key)
    if value is not None and not isinstance(value, kind):
        raise TranscriptRepairError(path, f"expected {expected}")
