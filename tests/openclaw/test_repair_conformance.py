"""unstuck's pairing repair against OpenClaw's own, run by Node on the same transcripts.

OpenClaw's ``repairToolUseResultPairing`` is imported from the installed package's ``dist/``
(tests/openclaw/repair_reference.mjs) and both repairs get each case under both errored-turn
policies. Compared: each message's role, call id, ``isError`` and text; a synthetic result
counts as one whoever wrote it (texts and details differ on purpose, docs/transcript-repair.md).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from workers.core.transcript import is_synthetic, repair_pairing

OPENCLAW = os.environ.get("UNSTUCK_OPENCLAW_BIN", "")
NODE_BIN = os.environ.get("UNSTUCK_OPENCLAW_NODE_BIN", "")
REFERENCE = Path(__file__).with_name("repair_reference.mjs")


def _call(call_id: str, name: str = "exec") -> dict[str, Any]:
    return {"type": "toolCall", "id": call_id, "name": name, "arguments": {}}


def _turn(*call_ids: str, stop: str = "toolUse") -> dict[str, Any]:
    return {"role": "assistant", "content": [_call(c) for c in call_ids], "stopReason": stop}


def _result(call_id: str | None, text: str = "ok", *, is_error: bool = False) -> dict[str, Any]:
    message = {"role": "toolResult", "toolName": "exec", "content": [{"type": "text", "text": text}]}
    return message | ({"toolCallId": call_id} if call_id else {}) | {"isError": is_error}


USER = {"role": "user", "content": [{"type": "text", "text": "go on"}]}

CASES: dict[str, list[dict[str, Any]]] = {
    "an id-less legacy result, the only open call": [USER, _turn("c1"), _result(None)],
    "an id-less legacy error, the only open call": [USER, _turn("c1"), _result(None, "no", is_error=True)],
    "an id-less result after an earlier unanswered call of its name": [
        _turn("c0"),
        USER,
        _turn("c1"),
        _result(None, "mine"),
    ],
    "an id-less result, then the call's own": [_turn("c1"), _result(None, "guess"), _result("c1", "real")],
    "an id-less result in a turn of two calls": [_turn("c1", "c2"), USER, _result(None)],
    "an id-less result after a failed turn's call of its name": [
        _turn("c0", stop="error"),
        USER,
        _turn("c1"),
        _result(None, "mine"),
    ],
    "a provider-errored turn whose calls have no results": [USER, _turn("c1", stop="error"), USER],
    "an aborted turn whose calls have no results, then a healthy one": [
        _turn("c1", stop="aborted"),
        USER,
        _turn("c2"),
        _result("c2"),
    ],
    "an errored turn with its result": [_turn("c1", stop="error"), _result("c1")],
    "a displaced result behind a user turn": [_turn("c1"), USER, _result("c1")],
    "a late result after the next call turn": [_turn("c1"), USER, _turn("c2"), _result("c2"), _result("c1")],
}


def _shape(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    def one(message: dict[str, Any]) -> tuple[Any, ...]:
        if message.get("role") != "toolResult":
            return (message.get("role"), message.get("stopReason"), len(message.get("content", [])))
        if is_synthetic(message):
            return ("toolResult", message.get("toolCallId"), "synthetic")
        texts = [b.get("text") for b in message.get("content", []) if isinstance(b, dict)]
        return ("toolResult", message.get("toolCallId"), message.get("isError"), tuple(texts))

    return [one(m) for m in messages]


@pytest.fixture(scope="module")
def openclaws() -> dict[str, dict[str, list[dict[str, Any]]]]:
    package = Path(OPENCLAW).parent.parent / "openclaw"  # node_modules/.bin/openclaw -> node_modules/openclaw
    done = subprocess.run(
        [str(Path(NODE_BIN) / "node"), str(REFERENCE)],
        input=json.dumps(CASES),
        capture_output=True,
        text=True,
        env={**os.environ, "OPENCLAW_PACKAGE": str(package)},
        timeout=60,
        check=True,
    )
    answer: dict[str, dict[str, list[dict[str, Any]]]] = json.loads(done.stdout)
    return answer


@pytest.mark.parametrize("policy", ["preserve", "drop"])
@pytest.mark.parametrize("case", list(CASES))
def test_pairing_repair_matches_openclaws(
    openclaws: dict[str, dict[str, list[dict[str, Any]]]], case: str, policy: str
) -> None:
    ours = repair_pairing(CASES[case], errored_turns="preserve" if policy == "preserve" else "drop")
    assert _shape(ours.messages) == _shape(openclaws[case][policy])
