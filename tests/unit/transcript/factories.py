"""Small builders of neutral messages for the transcript tests."""

from __future__ import annotations

from typing import Any

from workers.core.transcript import DEFAULT_MISSING_TEXT, make_synthetic_result


def call(call_id: str, name: str = "read", **extra: Any) -> dict[str, Any]:
    return {"type": "toolCall", "id": call_id, "name": name, "arguments": {}, **extra}


def asst(*calls: dict[str, Any] | str, stop: str | None = None) -> dict[str, Any]:
    content = [c if isinstance(c, dict) else call(c) for c in calls]
    return {"role": "assistant", "content": content} | ({"stopReason": stop} if stop else {})


def text_asst(text: str = "thinking aloud") -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def res(call_id: str | None, text: str = "ok", name: str | None = "read", **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "toolResult"}
    if call_id is not None:
        message["toolCallId"] = call_id
    if name is not None:
        message["toolName"] = name
    return message | {"content": [{"type": "text", "text": text}], "isError": False} | extra


def user(text: str = "hi") -> dict[str, Any]:
    return {"role": "user", "content": text}


def syn(call_id: str, name: str = "read", text: str = DEFAULT_MISSING_TEXT) -> dict[str, Any]:
    return make_synthetic_result(call_id, name, text)
