"""The neutral transcript form and the helpers every step shares.

Messages are plain JSON objects so that repair keeps every field it does not understand, and so
that "nothing changed" can be answered by object identity.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

__all__ = [
    "CALL_BLOCK_TYPES",
    "CALL_ID_KEYS",
    "DEFAULT_MISSING_TEXT",
    "DEFAULT_SYNTHETIC_TEXTS",
    "FAILED_STOP_REASONS",
    "MISSING_RESULT_REASON",
    "RESPONSES_ITEM_ID",
    "RESULT_ID_KEYS",
    "SNAKE_CALL_BLOCK_TYPES",
    "Block",
    "Message",
    "ResultLookup",
    "call_blocks",
    "is_failed_turn",
    "is_synthetic",
    "make_synthetic_result",
    "raw_result_id",
    "result_id",
    "result_id_key",
]

Message = dict[str, Any]
Block = dict[str, Any]
ResultLookup = Callable[[str, str], "Mapping[str, Any] | None"]
"""``lookup(call_id, tool_name)``: a real or ledger-written result for the call, or None."""

CALL_BLOCK_TYPES: Final = frozenset({"toolCall", "toolUse", "functionCall"})
SNAKE_CALL_BLOCK_TYPES: Final = frozenset({"tool_call", "tool_use", "function_call"})
RESULT_ID_KEYS: Final = ("toolCallId", "toolUseId", "tool_call_id", "tool_use_id", "callId", "call_id")
CALL_ID_KEYS: Final = ("id", "call_id", "toolCallId", "toolUseId", "tool_call_id", "tool_use_id")
RESPONSES_ITEM_ID: Final = "responsesItemId"
IMPLICIT_ID: Final = "geminiImplicitId"
"""Marks a call block whose id an adapter made up because the provider sent none (Gemini)."""
"""A call block's Responses item id (``fc_...``), kept apart from the ``call_id`` results answer."""
FAILED_STOP_REASONS: Final = frozenset({"error", "aborted"})
MISSING_RESULT_REASON: Final = "missing_tool_result"
DEFAULT_MISSING_TEXT: Final = (
    "[unstuck] missing tool result in session history; inserted synthetic error result for transcript repair."
)
# The default synthetic texts, OpenClaw's and ours: a transcript that went
# through a wire format marks its placeholders only by text, as ``details`` did not survive the trip.
DEFAULT_SYNTHETIC_TEXTS: Final = frozenset(
    f"[{brand}] missing tool result in session history;"
    " inserted synthetic error result for transcript repair."
    for brand in ("openclaw", "moltbot", "unstuck")
)


def call_blocks(message: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """The pairable calls of an assistant message as ``(id, name)``, in content order, repeats kept."""
    if message.get("role") != "assistant":
        return []
    content = message.get("content")
    if not isinstance(content, list):
        return []
    calls: list[tuple[str, str | None]] = []
    for block in content:
        if not isinstance(block, dict) or block.get("type") not in CALL_BLOCK_TYPES:
            continue
        call_id = block.get("id")
        if isinstance(call_id, str) and call_id:
            name = block.get("name")
            calls.append((call_id, name if isinstance(name, str) else None))
    return calls


def result_id_key(message: Mapping[str, Any]) -> str | None:
    """The key holding a tool result's call id: the first alias with a non-blank string."""
    value = message.get("toolCallId")  # the canonical key, first of the aliases: a fast path
    if isinstance(value, str) and value.strip():
        return "toolCallId"
    for key in RESULT_ID_KEYS:
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            return key
    return None


def result_id(message: Mapping[str, Any]) -> str | None:
    """The trimmed call id a tool result answers, or None when it names none."""
    value = message.get("toolCallId")
    if isinstance(value, str) and (trimmed := value.strip()):
        return trimmed
    key = result_id_key(message)
    return None if key is None else str(message[key]).strip()


def raw_result_id(message: Mapping[str, Any]) -> str | None:
    """The call id a tool result answers exactly as written (what encoders send back), or None."""
    key = result_id_key(message)
    return None if key is None else str(message[key])


def is_failed_turn(message: Mapping[str, Any]) -> bool:
    """Whether an assistant turn ended in ``error`` or ``aborted``."""
    return message.get("stopReason") in FAILED_STOP_REASONS


def is_synthetic(message: Mapping[str, Any]) -> bool:
    """Whether a tool result is a placeholder a real result may replace.

    Ours carry ``details.synthetic`` with ``isError``; OpenClaw's carry
    ``details.openclawSyntheticMissingToolResult``, or, once ``details`` is gone (every wire
    format drops it), exactly its default text with ``isError`` true or unknown (Chat and
    Responses results have no error flag).
    """
    details = message.get("details")
    if details is None and message.get("isError") is False:
        return False  # the common case, first
    if isinstance(details, dict):
        if details.get("openclawSyntheticMissingToolResult") is True:
            return True
        if details.get("synthetic") is True and message.get("isError") is True:
            return True
    if message.get("isError") is False:
        return False
    content = message.get("content")
    if isinstance(content, str):
        return content in DEFAULT_SYNTHETIC_TEXTS
    return isinstance(content, list) and any(
        isinstance(block, dict)
        and block.get("type") == "text"
        and block.get("text") in DEFAULT_SYNTHETIC_TEXTS
        for block in content
    )


def make_synthetic_result(call_id: str, tool_name: str | None, text: str) -> Message:
    """A structurally marked error result standing in for a call that has no result."""
    return {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": tool_name.strip() if tool_name and tool_name.strip() else "unknown",
        "content": [{"type": "text", "text": text}],
        "isError": True,
        "details": {"synthetic": True, "reason": MISSING_RESULT_REASON},
    }
