"""Tool-call id sanitisation."""

from __future__ import annotations

import re

import pytest

from tests.unit.transcript.factories import asst, call, res
from workers.core.transcript import IdMode, repair_pairing, sanitize_tool_call_id, sanitize_tool_call_ids


@pytest.mark.parametrize(
    ("raw", "mode", "expected"),
    [
        ("call|item:123", "strict", "callitem123"),
        ("whatsapp_login_1768799841527_1", "strict", "whatsapplogin17687998415271"),
        ("call_abc|item:123", "strict9", "callabcit"),
        ("functions.read:0", "strict", "functions.read:0"),
        ("functions exec:0", "strict", "functions.exec:0"),
        ("|||", "strict", "sanitizedtoolid"),
        (None, "strict", "defaulttoolid"),
        (None, "strict9", "defaultid"),
        ("x" * 100, "strict", "x" * 40),
    ],
)
def test_known_values(raw: object, mode: IdMode, expected: str) -> None:
    assert sanitize_tool_call_id(raw, mode) == expected


@pytest.mark.parametrize("raw", ["ab", "a_b-c", "", "___"])
def test_strict9_short_ids_are_nine_hex_chars(raw: str) -> None:
    assert re.fullmatch(r"[0-9a-f]{9}", sanitize_tool_call_id(raw, "strict9"))


@pytest.mark.parametrize("mode", ["strict", "strict9"])
def test_colliding_ids_get_distinct_ids_and_results_follow(mode: IdMode) -> None:
    # Given ids that sanitise to the same value, and a raw id repeated across turns
    given = [
        asst("call_1", "call-1"),
        res("call-1", "b"),
        res("call_1", "a"),
        asst("call_1"),
        res("call_1", "c"),
    ]
    # When
    result = sanitize_tool_call_ids(given, mode)
    # Then
    out = result.messages
    first, second = (block["id"] for block in out[0]["content"])
    third = out[3]["content"][0]["id"]
    assert len({first, second, third}) == 3
    assert [out[1]["toolCallId"], out[2]["toolCallId"], out[4]["toolCallId"]] == [second, first, third]
    pattern = r"[A-Za-z0-9]{1,40}" if mode == "strict" else r"[A-Za-z0-9]{9}"
    assert all(re.fullmatch(pattern, i) for i in (first, second, third))
    assert repair_pairing(out).report.dropped_orphan_count == 0


def test_repeated_id_within_turn_gets_distinct_ids() -> None:
    out = sanitize_tool_call_ids([asst("c1", "c1"), res("c1", "a"), res("c1", "b")]).messages
    ids = [block["id"] for block in out[0]["content"]]
    assert ids[0] == "c1"
    assert ids[1] != "c1"
    assert [out[1]["toolCallId"], out[2]["toolCallId"]] == ids


def test_result_without_pending_call_is_seeded_apart() -> None:
    out = sanitize_tool_call_ids([res("c_1"), asst("c_1"), res("c_1")]).messages
    assert out[0]["toolCallId"] == "c1toolresult1"
    assert out[2]["toolCallId"] == out[1]["content"][0]["id"] == "c1"


def test_valid_ids_untouched_returns_same_list() -> None:
    given = [asst("abc123"), res("abc123")]
    assert sanitize_tool_call_ids(given).messages is given


def test_native_anthropic_ids_preserved_when_asked() -> None:
    given = [asst("toolu_01AbC"), res("toolu_01AbC"), asst(call("toolu_01AbC"))]
    out = sanitize_tool_call_ids(given, preserve_anthropic_ids=True).messages
    assert out[0]["content"][0]["id"] == "toolu_01AbC"
    assert out[2]["content"][0]["id"] != "toolu_01AbC"


def test_alias_result_key_rewritten() -> None:
    out = sanitize_tool_call_ids([asst("c-1"), {"role": "toolResult", "toolUseId": "c-1"}]).messages
    assert out[1] == {"role": "toolResult", "toolUseId": "c1"}
