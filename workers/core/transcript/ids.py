"""Tool-call id sanitisation for providers with strict id rules.

Ids are rewritten per occurrence: a raw id repeated across calls gets a distinct new id each
time, and results take the new ids of their raw id first-in first-out, so pairs stay pairs.

The target provider's rules decide what an id may look like, never where it came from: native
Kimi ids (``functions.read:0``) survive ``strict`` only where the policy says the provider
takes them (not Anthropic, whose ids must match ``^[a-zA-Z0-9_-]+$``). ``responses`` keeps any
characters but makes ids unique and at most 64 long, and drops Responses item ids (``fc_...``)
that repeat or lack the ``fc`` prefix (the item id is optional; the API rejects both).
"""

from __future__ import annotations

import hashlib
import re
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal

from workers.core.transcript.model import CALL_BLOCK_TYPES, RESPONSES_ITEM_ID, Message, result_id_key
from workers.core.transcript.report import IdReport

__all__ = ["IdMode", "SanitizedIds", "sanitize_tool_call_id", "sanitize_tool_call_ids"]

IdMode = Literal["strict", "strict9", "responses"]

_NON_ALNUM: Final = re.compile(r"[^A-Za-z0-9]")
_KIMI_NATIVE: Final = re.compile(r"^functions\.[A-Za-z0-9_-]+:\d+$")
_KIMI_MANGLED: Final = re.compile(r"^functions\s+([A-Za-z0-9_-]+):(\d+)$")
_ANTHROPIC_NATIVE: Final = re.compile(r"^toolu_[A-Za-z0-9_]+$")
_STRICT_MAX: Final = 40
_STRICT_HASHED_BASE: Final = 32
_RESPONSES_MAX: Final = 64
_RESPONSES_HASHED_BASE: Final = 55


@dataclass(frozen=True)
class SanitizedIds:
    """The rewritten messages (the input list itself when nothing changed) and the counts."""

    messages: list[Any]
    report: IdReport
    invented_result_ids: int = 0
    """Results with no pending call, given ids of their own; pairing then has work to redo."""


def sanitize_tool_call_id(raw: object, mode: IdMode, *, keep_kimi_ids: bool = True) -> str:
    """One id in the form ``mode`` demands, ignoring collisions.

    ``keep_kimi_ids`` lets ``strict`` keep (and un-mangle) native Kimi ids, for providers that take them.
    """
    if mode == "strict9":
        return _strict9(raw)
    if mode == "responses":
        return _responses(raw)
    if not isinstance(raw, str):
        return "defaulttoolid"
    if keep_kimi_ids:
        kimi = _KIMI_MANGLED.sub(r"functions.\1:\2", raw)
        if _KIMI_NATIVE.match(kimi):
            return kimi
    return _NON_ALNUM.sub("", raw)[:_STRICT_MAX] or "sanitizedtoolid"


def sanitize_tool_call_ids(
    messages: list[Any],
    mode: IdMode = "strict",
    *,
    preserve_anthropic_ids: bool = False,
    keep_kimi_ids: bool = True,
) -> SanitizedIds:
    """Rewrite every call id into ``mode`` without collisions, and every result to its call's new id."""
    rewriter = _Rewriter(mode, preserve_anthropic_ids, keep_kimi_ids)
    output = [rewriter.message(message) for message in messages]
    report = IdReport(
        rewriter.calls_rewritten,
        rewriter.results_rewritten,
        tuple(rewriter.mapping),
        rewriter.item_ids_dropped,
    )
    changed = any(a is not b for a, b in zip(output, messages, strict=True))
    invented = sum(rewriter.orphan_results.values())
    return SanitizedIds(output if changed else messages, report, invented)


def _strict9(raw: object) -> str:
    if not isinstance(raw, str):
        return "defaultid"
    alnum = _NON_ALNUM.sub("", raw)
    if len(alnum) >= 9:
        return alnum[:9]
    return _sha(alnum or "sanitized")[:9]


def _responses(raw: object) -> str:
    if not isinstance(raw, str) or not raw:
        return "call_default"
    if len(raw) <= _RESPONSES_MAX:
        return raw
    return raw[:_RESPONSES_HASHED_BASE] + "_" + _sha(raw)[:8]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class _Rewriter:
    def __init__(self, mode: IdMode, preserve_anthropic_ids: bool, keep_kimi_ids: bool) -> None:
        self.mode: IdMode = mode
        self.preserve_anthropic_ids = preserve_anthropic_ids
        self.keep_kimi_ids = keep_kimi_ids
        self.form: Callable[[object], str] = (
            _strict9 if mode == "strict9" else _responses if mode == "responses" else self._strict
        )
        self.used: set[str] = set()
        self.item_ids: set[str] = set()
        self.item_ids_dropped = 0
        self.seen_calls: dict[str, int] = {}
        self.orphan_results: dict[str, int] = {}
        self.first_pending: dict[str, str] = {}  # most ids occur once: no queue for them
        self.pending: dict[str, deque[str]] = {}
        self.mapping: list[tuple[str, str]] = []
        self.calls_rewritten = 0
        self.results_rewritten = 0

    def message(self, message: Any) -> Any:
        if not isinstance(message, dict):
            return message
        if message.get("role") == "assistant" and isinstance(message.get("content"), list):
            content = [self.block(block) for block in message["content"]]
            if any(a is not b for a, b in zip(content, message["content"], strict=True)):
                return {**message, "content": content}
        elif message.get("role") == "toolResult":
            return self.result(message)
        return message

    def block(self, block: Any) -> Any:
        if not isinstance(block, dict) or block.get("type") not in CALL_BLOCK_TYPES:
            return block
        raw = block.get("id")
        text = raw if isinstance(raw, str) else str(raw)
        occurrence = self.seen_calls.get(text, 0)
        self.seen_calls[text] = occurrence + 1
        if self.preserve_anthropic_ids and self._keeps_native(raw, occurrence):
            new_id = text
            self.used.add(new_id)
        else:
            new_id = self._unique(raw if occurrence == 0 else f"{raw}:{occurrence}")
        if occurrence == 0:
            self.first_pending[text] = new_id
        else:
            self.pending.setdefault(text, deque()).append(new_id)
        self.mapping.append((text, new_id))
        item_id = block.get(RESPONSES_ITEM_ID)
        item_ok = item_id is None or self._item_id_ok(item_id)
        if new_id == raw and item_ok:
            return block
        self.calls_rewritten += new_id != raw
        rewritten = {**block, "id": new_id}
        if not item_ok:
            self.item_ids_dropped += 1
            del rewritten[RESPONSES_ITEM_ID]
        return rewritten

    def _item_id_ok(self, item_id: object) -> bool:
        if not isinstance(item_id, str) or not item_id.startswith("fc") or item_id in self.item_ids:
            return False
        self.item_ids.add(item_id)
        return True

    def result(self, message: Message) -> Message:
        key = result_id_key(message)
        if key is None:
            return message
        raw = message[key]
        text = raw if isinstance(raw, str) else str(raw)
        # First-in first-out per raw id: a first occurrence is always older than the repeats.
        new_id = self.first_pending.pop(text, None)
        queue = self.pending.get(text) if new_id is None else None
        if queue:
            new_id = queue.popleft()
        elif new_id is None:
            count = self.orphan_results.get(str(raw), 0) + 1
            self.orphan_results[str(raw)] = count
            new_id = self._unique(f"{raw}:tool_result:{count}")
        if new_id == raw:
            return message
        self.results_rewritten += 1
        return {**message, key: new_id}

    def _strict(self, raw: object) -> str:
        return sanitize_tool_call_id(raw, "strict", keep_kimi_ids=self.keep_kimi_ids)

    def _keeps_native(self, raw: object, occurrence: int) -> bool:
        if occurrence or not isinstance(raw, str):
            return False
        return bool(_ANTHROPIC_NATIVE.match(raw)) and raw not in self.used

    def _unique(self, seed: object) -> str:
        base = self.form(seed)
        if base not in self.used:  # the common case, without building the candidate chain
            self.used.add(base)
            return base
        new_id = next(c for c in self._candidates(base, str(seed)) if c not in self.used)
        self.used.add(new_id)
        return new_id

    def _candidates(self, base: str, seed: str) -> Iterator[str]:
        yield base
        if self.mode == "strict9":
            for i in range(1000):
                yield _sha(f"{seed}:{i}")[:9]
        elif self.mode == "responses":
            yield base[:_RESPONSES_HASHED_BASE] + "_" + _sha(seed)[:8]
            for i in range(2, 1000):
                yield f"{base[: _RESPONSES_MAX - 6]}_x{i}"
        else:
            yield base[:_STRICT_HASHED_BASE] + _sha(seed)[:8]
            for i in range(2, 1000):
                suffix = f"x{i}"
                yield base[: _STRICT_MAX - len(suffix)] + suffix
        # Past a thousand collisions, keep hashing: ids stay unique with no clock reading.
        i = 1000
        while True:
            yield _sha(f"{seed}:{i}")[: 9 if self.mode == "strict9" else _STRICT_MAX]
            i += 1
