"""Turn-level fixes the policy asks for: blank texts, thinking, turn order.

* ``sanitize_mode == "full"`` drops blank text blocks (Anthropic and Gemini reject empty texts)
  and user or assistant turns left with nothing in them.
* ``drop_thinking_blocks`` removes thinking blocks; ``sanitize_thought_signatures`` removes
  thought signatures that are not base64.
* ``validate_gemini_turns`` merges an assistant turn without calls into the assistant turn right
  after it (Gemini rejects a call turn that does not follow a user turn);
  ``validate_anthropic_turns`` merges consecutive user turns.
* ``apply_google_turn_ordering`` puts a short user turn first when history starts with the model.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

from workers.core.transcript.model import Message, call_blocks
from workers.core.transcript.report import TurnReport

__all__ = ["BOOTSTRAP_TEXT", "clean_blocks", "fix_turn_order"]

BOOTSTRAP_TEXT: Final = "(session bootstrap)"
_SIGNATURES: Final = ("thoughtSignature", "thinkingSignature")
_BASE64: Final = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")
_EDITED_ROLES: Final = ("user", "assistant")


def clean_blocks(
    messages: list[Any], *, blank_texts: bool, thinking: bool, signatures: bool
) -> tuple[list[Any], TurnReport]:
    """Drop blank texts, thinking blocks and non-base64 signatures, as asked; before pairing."""
    if not (blank_texts or thinking or signatures):
        return messages, TurnReport()
    counts = {"texts": 0, "thinking": 0, "signatures": 0, "turns": 0}
    output: list[Any] = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in _EDITED_ROLES:
            output.append(message)
            continue
        content = message.get("content")
        if isinstance(content, str):
            if blank_texts and not content.strip():
                counts["turns"] += 1
                continue
            output.append(message)
            continue
        if not isinstance(content, list):
            output.append(message)
            continue
        kept = _kept_blocks(content, blank_texts, thinking, signatures, counts)
        if kept is content:
            output.append(message)
        elif kept or not blank_texts:
            output.append({**message, "content": kept})
        else:
            counts["turns"] += 1
    report = TurnReport(
        dropped_blank_texts=counts["texts"],
        dropped_thinking_blocks=counts["thinking"],
        dropped_signatures=counts["signatures"],
        dropped_empty_turns=counts["turns"],
    )
    return (output if report.changed else messages), report


def _kept_blocks(
    content: list[Any], blank_texts: bool, thinking: bool, signatures: bool, counts: dict[str, int]
) -> list[Any]:
    kept: list[Any] = []
    for block in content:
        if not isinstance(block, dict):
            kept.append(block)
        elif blank_texts and block.get("type") == "text" and not str(block.get("text", "")).strip():
            counts["texts"] += 1
        elif thinking and block.get("type") in ("thinking", "redacted_thinking"):
            counts["thinking"] += 1
        elif signatures and any(_bad_signature(block.get(key)) for key in _SIGNATURES):
            counts["signatures"] += 1
            kept.append({k: v for k, v in block.items() if k not in _SIGNATURES or not _bad_signature(v)})
        else:
            kept.append(block)
    same = len(kept) == len(content) and all(a is b for a, b in zip(kept, content, strict=True))
    return content if same else kept


def _bad_signature(value: object) -> bool:
    return isinstance(value, str) and not (len(value) % 4 == 0 and _BASE64.match(value))


def fix_turn_order(
    messages: list[Any], *, merge_assistants: bool, merge_users: bool, user_first: bool
) -> tuple[list[Any], TurnReport]:
    """Merge consecutive turns and put a user turn first, as asked; after pairing."""
    output = messages
    merged_assistants = merged_users = 0
    if merge_assistants:
        output, merged_assistants = _merge(output, "assistant", _mergeable_assistants)
    if merge_users:
        output, merged_users = _merge(output, "user", _mergeable_users)
    bootstrap = user_first and _starts_with_assistant(output)
    if bootstrap:
        output = [{"role": "user", "content": BOOTSTRAP_TEXT}, *output]
    report = TurnReport(
        merged_assistant_turns=merged_assistants, merged_user_turns=merged_users, added_bootstrap=bootstrap
    )
    return output, report


def _merge(
    messages: list[Any], role: str, mergeable: Callable[[Message, Message], bool]
) -> tuple[list[Any], int]:
    output: list[Any] = []
    merged = 0
    for message in messages:
        previous = output[-1] if output else None
        if (
            isinstance(message, dict)
            and isinstance(previous, dict)
            and message.get("role") == role == previous.get("role")
            and mergeable(previous, message)
        ):
            # The later turn's metadata (stopReason) is the one its calls belong to.
            output[-1] = {**message, "content": _as_blocks(previous) + _as_blocks(message)}
            merged += 1
        else:
            output.append(message)
    return (output if merged else messages), merged


def _mergeable_assistants(first: Message, second: Message) -> bool:
    # A turn with calls has its results after it; one without (a failed turn kept as it was)
    # must stay apart, or its calls would be taken for the next turn's.
    return not call_blocks(first) and _has_blocks(first) and _has_blocks(second)


def _mergeable_users(first: Message, second: Message) -> bool:
    return _has_blocks(first) and _has_blocks(second)


def _has_blocks(message: Message) -> bool:
    return isinstance(message.get("content"), str | list)


def _as_blocks(message: Message) -> list[Any]:
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _starts_with_assistant(messages: list[Any]) -> bool:
    first = next(
        (m for m in messages if isinstance(m, dict) and m.get("role") not in ("system", "developer")), None
    )
    return first is not None and first.get("role") == "assistant"
