"""Stable hashing of tool-call arguments and outcomes.

Only equality of hashes matters: the same logical value gives the same hash, whatever the
key order. Outcome hashes ignore the fields that change on every call without meaning any
progress (pids, durations, working directories, message ids, timestamps), so a loop of
identical work is recognised as one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "UNDEFINED",
    "OutcomeHash",
    "hash_args",
    "hash_outcome",
    "is_loop_veto",
    "normalize_tool_name",
    "sha256_hex",
    "stable_stringify",
]


class _Undefined:
    """JavaScript's ``undefined``: a missing result, which gives no hash."""

    _instance: _Undefined | None = None

    def __new__(cls) -> _Undefined:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNDEFINED"


UNDEFINED: Final = _Undefined()

_TOOL_ALIASES: Final = {"bash": "exec", "apply-patch": "apply_patch"}
_UNKNOWN_TOOL_PATTERNS: Final = (
    re.compile(r"unknown tool[:\s]+[\"']?([a-z0-9_.-]+)[\"']?", re.IGNORECASE),
    re.compile(r"tool\s+[\"']?([a-z0-9_.-]+)[\"']?\s+(?:not found|is not available)", re.IGNORECASE),
)
_EXEC_FINISHED: Final = frozenset({"completed", "failed"})
_EXEC_APPROVAL: Final = frozenset({"approval-pending", "approval-unavailable"})
_MESSAGE_SEND_ACTIONS: Final = frozenset(
    {
        "send",
        "broadcast",
        "reply",
        "thread-reply",
        "sendWithEffect",
        "sendAttachment",
        "upload-file",
        "sticker",
        "poll",
    }
)
_VOLATILE_SEND_KEYS: Final = frozenset(
    {
        "messageId",
        "message_id",
        "messageIds",
        "platformMessageId",
        "platformMessageIds",
        "fileId",
        "file_id",
        "fileKey",
        "pollId",
        "poll_id",
        "receipt",
        "runId",
        "idempotencyKey",
        "ts",
        "timestamp",
        "sentAt",
        "deliveredAt",
        "createdAt",
    }
)


@dataclass(frozen=True)
class OutcomeHash:
    """The hash of one executed call's outcome; ``result_hash`` is None when nothing is recorded."""

    result_hash: str | None
    unknown_tool_name: str | None = None


def normalize_tool_name(name: str) -> str:
    """Lower-case a tool name and apply the aliases (``bash`` → ``exec``); empty becomes ``tool``."""
    lowered = name.strip().lower()
    return _TOOL_ALIASES.get(lowered, lowered) or "tool"


def sha256_hex(text: str) -> str:
    """SHA-256 hex digest of a string's UTF-8 bytes (lone surrogates replaced)."""
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


def stable_stringify(value: Any) -> str:
    """Serialise a value with object keys sorted at every level; cycles become ``"[Circular]"``."""
    return _stable(value, set())


def _stable(value: Any, active: set[int]) -> str:
    if value is None:
        return "null"
    if value is UNDEFINED:
        return "undefined"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bytes | bytearray):
        return json.dumps(base64.b64encode(bytes(value)).decode("ascii"))
    if isinstance(value, BaseException):
        value = {"name": type(value).__name__, "message": str(value), "stack": UNDEFINED}
    if id(value) in active:
        return json.dumps("[Circular]")
    if not isinstance(value, Mapping | Sequence):
        return json.dumps(str(value))
    # Only the current path counts as a cycle: a value repeated in two branches is serialised twice.
    active.add(id(value))
    try:
        if isinstance(value, Mapping):
            items = sorted((str(key), item) for key, item in value.items())
            body = ",".join(f"{json.dumps(key)}:{_stable(item, active)}" for key, item in items)
            return "{" + body + "}"
        return "[" + ",".join(_stable(item, active) for item in value) + "]"
    finally:
        active.discard(id(value))


def _number(value: float) -> str:
    if not math.isfinite(value):
        return json.dumps("Infinity" if value > 0 else "-Infinity" if value < 0 else "NaN")
    # JSON numbers 1 and 1.0 are the same number to OpenClaw.
    return str(int(value)) if value.is_integer() else repr(value)


def hash_args(tool: str, args: Any) -> str:
    """The args hash ``"<tool>:" + sha256(stable(args))``; it includes the tool name."""
    return f"{tool}:{sha256_hex(stable_stringify(args))}"


def is_loop_veto(result: Any) -> bool:
    """True for the loop detector's own veto result, which must never be hashed."""
    details = result.get("details") if isinstance(result, Mapping) else None
    return (
        isinstance(details, Mapping)
        and details.get("status") == "blocked"
        and details.get("deniedReason") == "tool-loop"
    )


def hash_outcome(
    tool: str,
    args: Any,
    result: Any,
    *,
    is_error: bool = False,
    send_tools: frozenset[str] = frozenset(),
) -> OutcomeHash:
    """Hash an outcome by the precedence rules below; ``send_tools`` adds provider send tools."""
    if is_error:
        return _error_hash(result)
    if result is UNDEFINED:
        return OutcomeHash(None)
    if not isinstance(result, Mapping):
        return OutcomeHash(sha256_hex(stable_stringify(result)))
    raw_details = result.get("details")
    details: Mapping[str, Any] = raw_details if isinstance(raw_details, Mapping) else {}
    text = _joined_text(result.get("content"))
    if is_loop_veto(result):
        return OutcomeHash(None)
    shaped = _shaped_outcome(tool, args, details, text, send_tools)
    if shaped is None:
        shaped = {"details": details, "text": text}
    return OutcomeHash(sha256_hex(stable_stringify(shaped)))


def _shaped_outcome(
    tool: str, args: Any, details: Mapping[str, Any], text: str, send_tools: frozenset[str]
) -> Any | None:
    if tool == "exec":
        return _exec_shape(details, text)
    action = args.get("action") if isinstance(args, Mapping) else None
    if tool == "process" and action in ("poll", "log"):
        return _process_shape(action, details, text)
    if _is_send(tool, action, send_tools):
        # Text is left out on purpose: a send's text is the model's own input echoed back.
        return _strip_volatile(details)
    return None


def _error_hash(error: Any) -> OutcomeHash:
    message = _error_message(error)
    return OutcomeHash("error:" + sha256_hex(stable_stringify(message)), _unknown_tool_name(message))


def _error_message(error: Any) -> str:
    if isinstance(error, BaseException):
        return str(error) or type(error).__name__
    if isinstance(error, str):
        return error
    if isinstance(error, bool):
        return "true" if error else "false"
    if isinstance(error, int | float):
        return _number(float(error)) if isinstance(error, float) else str(error)
    return stable_stringify(error)


def _unknown_tool_name(message: str) -> str | None:
    for pattern in _UNKNOWN_TOOL_PATTERNS:
        match = pattern.search(message)
        if match:
            return match.group(1).lower()
    return None


def _joined_text(content: Any) -> str:
    if not isinstance(content, Sequence) or isinstance(content, str):
        return ""
    texts = [
        entry["text"]
        for entry in content
        if isinstance(entry, Mapping)
        and isinstance(entry.get("type"), str)
        and isinstance(entry.get("text"), str)
    ]
    return "\n".join(texts).strip()


def _exec_shape(details: Mapping[str, Any], text: str) -> dict[str, Any] | None:
    status = details.get("status")
    if status == "running":
        tail = details.get("tail")
        return {"status": status, "tail": tail if isinstance(tail, str) else ""}
    if status in _EXEC_FINISHED:
        exit_code = details.get("exitCode")
        aggregated = details.get("aggregated")
        output = aggregated.strip() if isinstance(aggregated, str) and aggregated.strip() else text
        return {
            "status": status,
            "exitCode": exit_code if _is_number(exit_code) else None,
            "timedOut": details.get("timedOut") is True,
            "output": output,
        }
    if status in _EXEC_APPROVAL:
        keys = ("status", "reason", "host", "command", "warningText")
        return {key: details.get(key) for key in keys}
    return None


def _process_shape(action: str, details: Mapping[str, Any], text: str) -> dict[str, Any]:
    if action == "poll":
        keys: tuple[str, ...] = ("status", "exitCode", "exitSignal", "aggregated")
    else:
        keys = ("status", "totalLines", "totalChars", "truncated", "exitCode", "exitSignal")
    return {"action": action, **{key: details.get(key) for key in keys}, "text": text}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_send(tool: str, action: Any, send_tools: frozenset[str]) -> bool:
    if tool == "sessions_send" or tool in send_tools:
        return True
    return tool == "message" and isinstance(action, str) and action in _MESSAGE_SEND_ACTIONS


def _strip_volatile(value: Any) -> Any:
    if isinstance(value, Mapping):
        delivery = _is_delivery_object(value)
        return {
            key: _strip_volatile(item)
            for key, item in value.items()
            if key not in _VOLATILE_SEND_KEYS and not (delivery and key == "id")
        }
    if isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray):
        return [_strip_volatile(item) for item in value]
    return value


def _is_delivery_object(value: Mapping[str, Any]) -> bool:
    if not (isinstance(value.get("id"), str) and isinstance(value.get("text"), str)):
        return False
    has_party = any(isinstance(value.get(key), str) for key in ("direction", "senderId", "accountId"))
    return has_party or isinstance(value.get("conversation"), Mapping)
