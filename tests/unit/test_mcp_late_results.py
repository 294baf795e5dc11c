"""Answers before the MCP client gives up: the still_running answer and what unstuck_result finds."""

from __future__ import annotations

import json

import pytest

from workers.core.models import TextBlock, ToolCall, ToolResult
from workers.errors import ConfigError
from workers.servers.mcp_late_results import (
    StillRunningCall,
    StillRunningCalls,
    answer_within_s,
    fetched_result,
    not_ready_result,
    still_running_result,
    unknown_call_result,
    wanted_call_id,
)
from workers.servers.mcp_sessions import CallTarget
from workers.servers.mcp_transports import request_ids
from workers.settings import McpSettings

SLOW = ToolCall(id="c1", name="slow", arguments={"seconds": 90})
ASKING = ToolCall(id="c2", name="unstuck_result", arguments={"call_id": "c1"})
WAITED = StillRunningCall(CallTarget("s", "r", "main", "c1"), "slow", started_ms=1_000)


def test_still_running_names_the_call_and_how_to_fetch_it() -> None:
    result = still_running_result(SLOW, elapsed_ms=58_000, attempt=1)
    text = result.content[0].text
    assert result.is_error
    assert (result.reason, result.details["call_id"]) == ("still_running", "c1")
    assert "is still running after 58s" in text
    assert 'unstuck_result tool and {"call_id": "c1"}' in text
    assert "do not call it again" in text


def test_a_late_result_is_the_answer_to_the_asking_call() -> None:
    late = ToolResult(
        tool_call_id="c1", tool_name="slow", content=(TextBlock(text="done"),), is_error=False, details={}
    )
    fetched = fetched_result(ASKING, WAITED, late)
    assert (fetched.tool_call_id, fetched.tool_name, fetched.is_error) == ("c2", "unstuck_result", False)
    assert fetched.content == late.content
    assert fetched.details == {"result_of": "c1", "tool": "slow"}


def test_not_ready_is_still_running_again_for_the_asking_call() -> None:
    result = not_ready_result(ASKING, WAITED, now_ms=121_000)
    assert (result.tool_call_id, result.tool_name, result.reason) == ("c2", "unstuck_result", "still_running")
    assert "Tool 'slow' is still running after 120s" in result.content[0].text
    assert 'again later with {"call_id": "c1"}' in result.content[0].text


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"call_id": " c1 "}, "c1"),
        ({"call_id": ""}, None),
        ({"call_id": 5}, None),
        ({}, None),
        ({"call_id": "c1", "more": 1}, None),
    ],
)
def test_only_a_call_id_string_is_asked_for(arguments: dict[str, object], expected: str | None) -> None:
    assert wanted_call_id(dict(arguments)) == expected


def test_an_unknown_or_missing_call_id_is_an_error_saying_which() -> None:
    assert "No call 'x'" in unknown_call_result(ASKING, "x").content[0].text
    assert "needs" in unknown_call_result(ASKING, None).content[0].text
    assert unknown_call_result(ASKING, "x").is_error


def test_only_the_newest_calls_are_remembered() -> None:
    calls = StillRunningCalls(limit=2)
    for call_id in ("a", "b", "c"):
        calls.add(StillRunningCall(CallTarget("s", "r", "main", call_id), "slow", 0))
    assert [calls.get(call_id) is not None for call_id in ("a", "b", "c")] == [False, True, True]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {}}, ["7"]),
        ({"jsonrpc": "2.0", "id": "x", "method": "tools/list"}, []),
        ({"jsonrpc": "2.0", "method": "notifications/initialized"}, []),
        ([{"id": 1, "method": "tools/call"}, {"id": 2, "method": "tools/call"}], ["1", "2"]),
    ],
)
def test_a_hang_up_cancels_the_tool_calls_of_its_body(body: object, expected: list[str]) -> None:
    assert request_ids(json.dumps(body).encode()) == expected


def test_a_body_that_is_not_json_names_no_request() -> None:
    assert request_ids(b"{nope") == []


def test_the_door_answers_inside_the_clients_timeout() -> None:
    assert answer_within_s(McpSettings()) == 58.0
    with pytest.raises(ConfigError, match=r"must be less than mcp\.client_timeout_s"):
        answer_within_s(McpSettings(client_timeout_s=2, answer_margin_s=2))
