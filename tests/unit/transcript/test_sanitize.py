"""Input sanitisation and details stripping."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.transcript.factories import asst, call, res, syn, user
from workers.core.transcript import sanitize_tool_call_inputs, strip_result_details

GOOD = call("c1")
TEXT = {"type": "text", "text": "note"}


@pytest.mark.parametrize(
    "block",
    [
        pytest.param({"type": "toolCall", "id": "c1", "name": "read"}, id="no input"),
        pytest.param({"type": "toolCall", "id": "c1", "name": "read", "arguments": None}, id="null input"),
        pytest.param({"type": "toolCall", "name": "read", "arguments": {}}, id="no id"),
        pytest.param({"type": "toolCall", "id": "  ", "name": "read", "arguments": {}}, id="blank id"),
        pytest.param(call("c1", name="   "), id="blank name"),
        pytest.param(call("c1", name="x" * 65), id="name over 64"),
        pytest.param(call("c1", name="rm -rf"), id="name charset"),
        pytest.param({"type": "toolCall", "id": "c1", "name": 5, "arguments": {}}, id="name not a string"),
        pytest.param(
            {"type": "tool_use", "id": "c1", "name": "bad name", "input": {}}, id="snake_case validated"
        ),
        pytest.param(call("a|b", partialJson='{"x":'), id="partialJson unparsable"),
    ],
)
def test_bad_call_block_dropped(block: dict[str, Any]) -> None:
    # Given
    given = [{"role": "assistant", "content": [TEXT, block], "stopReason": "toolUse"}]
    # When
    result = sanitize_tool_call_inputs(given)
    # Then
    assert result.messages == [{"role": "assistant", "content": [TEXT], "stopReason": "toolUse"}]
    assert result.report.dropped_tool_calls == 1


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(call("c1", arguments="{}"), id="string {} counts as input"),
        pytest.param({"type": "toolUse", "id": "c1", "name": "read", "input": {}}, id="toolUse input"),
        pytest.param({"type": "toolCall", "call_id": "c1", "name": "read", "arguments": {}}, id="alias id"),
        pytest.param(call("c1", name="ns:tool.v2-x_y"), id="newer charset"),
    ],
)
def test_good_call_block_kept_as_is(block: dict[str, Any]) -> None:
    given = [{"role": "assistant", "content": [block]}]
    assert sanitize_tool_call_inputs(given).messages is given


def test_assistant_left_empty_is_dropped() -> None:
    given = [user(), {"role": "assistant", "content": [{"type": "toolCall", "name": "read"}]}, user("b")]
    result = sanitize_tool_call_inputs(given)
    assert result.messages == [user(), user("b")]
    assert result.report.dropped_assistant_messages == 1


def test_name_trimmed_and_other_fields_kept() -> None:
    given = [asst(call("c1", name=" read ", extra=1))]
    result = sanitize_tool_call_inputs(given)
    assert result.messages == [asst(call("c1", name="read", extra=1))]
    assert result.report.trimmed_names == 1


@pytest.mark.parametrize(("allowed", "kept"), [(["READ "], True), (["write"], False), ([" "], True)])
def test_allowlist_is_case_insensitive(allowed: list[str], kept: bool) -> None:
    given = [asst(GOOD, call("c2", name="Read"))]
    result = sanitize_tool_call_inputs(given, allowed_tool_names=allowed)
    assert (result.messages is given) is kept


@pytest.mark.parametrize(
    ("stop", "call_id", "arguments", "partial", "kept"),
    [
        ("toolUse", "call|fc", {"a": 1}, '{"a":1}', True),
        ("toolUse", "call|fc", {}, "  ", True),
        ("toolUse", "call|fc", {"a": 1}, "  ", False),
        ("toolUse", "call", {"a": 1}, '{"a":1}', False),
        ("toolUse", "|fc", {"a": 1}, '{"a":1}', False),
        ("toolUse", "call|fc", {"a": 1}, "[1]", False),
        ("stop", "call|fc", {"a": 1}, '{"a":1}', False),
        ("aborted", "call|fc", {"a": 1}, '{"a":1}', False),
    ],
)
def test_streaming_block(
    stop: str, call_id: str, arguments: dict[str, Any], partial: str, kept: bool
) -> None:
    block = {
        "type": "toolCall",
        "id": call_id,
        "name": "read",
        "arguments": arguments,
        "partialJson": partial,
    }
    result = sanitize_tool_call_inputs([{"role": "assistant", "content": [block, TEXT], "stopReason": stop}])
    blocks = result.messages[0]["content"]
    expected = [{k: v for k, v in block.items() if k != "partialJson"}, TEXT] if kept else [TEXT]
    assert blocks == expected


def test_non_assistant_messages_untouched() -> None:
    given = [user(), res("c1"), {"role": "assistant", "content": "plain"}]
    assert sanitize_tool_call_inputs(given).messages is given


def test_strip_details() -> None:
    given = [asst("c1"), syn("c1"), user()]
    result = strip_result_details(given)
    assert "details" not in result.messages[1]
    assert result.stripped == 1
    assert strip_result_details(result.messages).messages is result.messages
