"""The MCP door's pure parts: session/run mapping, result shape, tool entries, argument tolerance."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, cast

import mcp_types as types
import pytest
from mcp.server import ServerRequestContext

import tests.misbehaving_tools  # noqa: F401 - registers the tools listed below
from workers.cli.main import main
from workers.core.models import TextBlock, ToolResult
from workers.servers.mcp_server import MALFORMED_ARGUMENTS, accept_any_arguments, to_mcp_result, tool_entries
from workers.servers.mcp_sessions import CallTarget, RunTracker, agent_of, resolve_target
from workers.settings import Settings

IDLE_MS = 300_000
AGE_MS = 900_000


def _ids() -> Any:
    counter = iter(range(1, 1000))
    return lambda: f"id{next(counter)}"


@pytest.mark.parametrize(
    ("meta", "session_id", "expected"),
    [
        (
            {"unstuck/session": "s", "unstuck/run": "r", "unstuck/agent": "coder", "unstuck/call": "c"},
            "sid",
            CallTarget("s", "r", "coder", "c", named_run=True),
        ),
        ({}, "sid", CallTarget("mcp:sid", "", "main", "mcp-id1")),
        ({"unstuck/run": "r"}, "sid", CallTarget("mcp:sid", "r", "main", "mcp-id1", named_run=True)),
        ({"unstuck/session": "  s  ", "unstuck/run": 7}, None, CallTarget("s", "", "main", "mcp-id1")),
        (None, None, CallTarget("mcp-call:mcp-id1", "mcp-id1", "main", "mcp-id1", ephemeral=True)),
        (
            {"unstuck/session": ""},
            None,
            CallTarget("mcp-call:mcp-id1", "mcp-id1", "main", "mcp-id1", ephemeral=True),
        ),
    ],
)
def test_a_call_goes_to_the_session_and_run_meta_names_else_the_transports(
    meta: dict[str, Any] | None, session_id: str | None, expected: CallTarget
) -> None:
    assert resolve_target(meta, mcp_session_id=session_id, new_id=_ids()) == expected


def test_names_from_meta_are_cut_to_a_sane_length() -> None:
    target = resolve_target({"unstuck/session": "s" * 1000}, mcp_session_id=None)
    assert len(target.session_key) == 256


def test_calls_share_a_run_until_the_client_is_idle() -> None:
    # Given a session whose first call began at 0 and was answered at 1 s
    tracker = RunTracker(IDLE_MS, new_id=_ids())
    first, replaced = tracker.begin("s", now_ms=0, max_age_ms=AGE_MS)
    tracker.finish("s", first, now_ms=1_000)
    # When the next call comes just inside the idle gap, and another one after it
    same, _ = tracker.begin("s", now_ms=1_000 + IDLE_MS - 1, max_age_ms=AGE_MS)
    tracker.finish("s", same, now_ms=1_000 + IDLE_MS)
    later, replaced_later = tracker.begin("s", now_ms=1_000 + 2 * IDLE_MS, max_age_ms=AGE_MS)
    # Then the first two share a run; the third starts a new one and ends the old
    assert (first, replaced) == ("mcp-id1", None)
    assert same == first
    assert (later, replaced_later) == ("mcp-id2", first)


def test_a_run_with_an_open_call_is_never_replaced() -> None:
    tracker = RunTracker(IDLE_MS, new_id=_ids())
    first, _ = tracker.begin("s", now_ms=0, max_age_ms=AGE_MS)
    second, replaced = tracker.begin("s", now_ms=10 * AGE_MS, max_age_ms=AGE_MS)
    assert (second, replaced) == (first, None)
    assert tracker.idle(20 * AGE_MS) == []


def test_an_old_run_rolls_over_between_calls() -> None:
    tracker = RunTracker(IDLE_MS, new_id=_ids())
    first, _ = tracker.begin("s", now_ms=0, max_age_ms=AGE_MS)
    tracker.finish("s", first, now_ms=AGE_MS)
    second, replaced = tracker.begin("s", now_ms=AGE_MS + 1, max_age_ms=AGE_MS)
    assert (second, replaced) == ("mcp-id2", first)


def test_after_a_named_run_the_next_unnamed_call_starts_a_new_run() -> None:
    tracker = RunTracker(IDLE_MS, new_id=_ids())
    first, _ = tracker.begin("s", now_ms=0, max_age_ms=AGE_MS)
    tracker.forget("s")
    second, replaced = tracker.begin("s", now_ms=1, max_age_ms=AGE_MS)
    assert (first, second, replaced) == ("mcp-id1", "mcp-id2", None)


def test_a_run_ended_under_the_door_is_forgotten_only_by_its_own_id() -> None:
    tracker = RunTracker(IDLE_MS, new_id=_ids())
    first, _ = tracker.begin("s", now_ms=0, max_age_ms=AGE_MS)
    tracker.forget("s", "some-older-run")
    assert tracker.begin("s", now_ms=1, max_age_ms=AGE_MS)[0] == first
    tracker.forget("s", first)
    assert tracker.begin("s", now_ms=2, max_age_ms=AGE_MS) == ("mcp-id2", None)


def test_runs_between_calls_are_due_a_heartbeat_once_per_interval() -> None:
    # Given one run between calls and one with a call open, both begun at 0
    tracker = RunTracker(IDLE_MS, new_id=_ids())
    quiet, _ = tracker.begin("quiet", agent_id="coder", now_ms=0, max_age_ms=AGE_MS)
    tracker.finish("quiet", quiet, now_ms=0)
    tracker.begin("busy", now_ms=0, max_age_ms=AGE_MS)
    # When the door asks before, at and just after one interval of 10 s
    early, due, again = (
        tracker.due_beats(9_999, 10_000),
        tracker.due_beats(10_000, 10_000),
        tracker.due_beats(10_001, 10_000),
    )
    # Then only the quiet run is due, once per interval, with its agent
    assert (early, due, again) == ([], [("quiet", quiet, "coder")], [])
    assert tracker.due_beats(20_000, 10_000) == [("quiet", quiet, "coder")]


def test_idle_runs_are_handed_out_once_and_forgotten() -> None:
    # Given two sessions, one idle since 0 and one with a call still open
    tracker = RunTracker(IDLE_MS, new_id=_ids())
    quiet, _ = tracker.begin("quiet", now_ms=0, max_age_ms=AGE_MS)
    tracker.finish("quiet", quiet, now_ms=0)
    busy, _ = tracker.begin("busy", now_ms=0, max_age_ms=AGE_MS)
    # When the door looks after the idle gap
    idle = tracker.idle(IDLE_MS)
    # Then only the quiet one ends, once; draining returns the rest
    assert idle == [("quiet", quiet)]
    assert tracker.idle(2 * IDLE_MS) == []
    assert tracker.drain() == [("busy", busy)]
    assert tracker.drain() == []


def test_a_result_keeps_its_text_error_flag_and_details() -> None:
    result = ToolResult(
        tool_call_id="c",
        tool_name="t",
        content=(TextBlock(text="a"), TextBlock(text="b")),
        is_error=True,
        details={"synthetic": True, "reason": "timeout_hard"},
    )
    mcp_result = to_mcp_result(result, CallTarget("s", "r", "main", "c"))
    wire = mcp_result.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert wire["isError"] is True
    assert wire["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert wire["_meta"]["unstuck/details"]["reason"] == "timeout_hard"
    assert (wire["_meta"]["unstuck/session"], wire["_meta"]["unstuck/run"]) == ("s", "r")


def test_tools_are_listed_with_their_schema_and_limit() -> None:
    entries = {tool.name: tool for tool in tool_entries(Settings())}
    echo = entries["echo"]
    assert echo.description == "Healthy tool."
    assert set(echo.input_schema["properties"]) == {"text", "times"}
    assert echo.input_schema["required"] == ["text"]
    assert echo.input_schema["additionalProperties"] is False
    assert echo.meta == {"unstuck/timeout_s": 5.0}
    assert echo.annotations is not None
    assert echo.annotations.idempotent_hint is True


def _context(method: str, params: Mapping[str, Any]) -> ServerRequestContext[Any, Any]:
    return ServerRequestContext(
        session=cast(Any, None),
        lifespan_context={},
        protocol_version="2025-11-25",
        method=method,
        params=params,
    )


async def test_arguments_that_are_not_an_object_reach_the_handler_marked() -> None:
    # Given a tools/call whose arguments are a string
    seen: list[Mapping[str, Any] | None] = []

    async def handler(ctx: ServerRequestContext[Any, Any]) -> dict[str, Any]:
        seen.append(ctx.params)
        return {}

    ctx = _context("tools/call", {"name": "echo", "arguments": "hi", "_meta": {"progressToken": 1}})
    # When it passes the middleware
    await accept_any_arguments(ctx, handler)
    # Then the handler gets an empty object and the JSON type in _meta
    assert seen == [
        {"name": "echo", "arguments": {}, "_meta": {"progressToken": 1, MALFORMED_ARGUMENTS: "a string"}}
    ]
    types.CallToolRequestParams.model_validate(seen[0], by_name=False)


@pytest.mark.parametrize(
    ("method", "params"),
    [("tools/call", {"name": "echo", "arguments": {"text": 5}}), ("tools/call", {"name": "e"}), ("ping", {})],
)
async def test_other_requests_pass_the_middleware_unchanged(method: str, params: dict[str, Any]) -> None:
    seen: list[Mapping[str, Any] | None] = []

    async def handler(ctx: ServerRequestContext[Any, Any]) -> dict[str, Any]:
        seen.append(ctx.params)
        return {}

    await accept_any_arguments(_context(method, params), handler)
    assert seen == [params]


def test_mcp_refuses_a_public_address_without_tokens(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [n for n in os.environ if n.startswith("UNSTUCK_")]:
        monkeypatch.delenv(name)
    assert main(["mcp", "--host", "0.0.0.0"]) == 2
    assert "api.tokens" in capsys.readouterr().err


def test_tools_list_shows_only_what_the_agent_may_call() -> None:
    # Given a global allowlist and an agent narrowing it
    settings = Settings(
        tools={"allow": ("echo", "boom")},
        agents={"list": [{"id": "narrow", "tool_allow": ("echo",)}]},
    )
    # Then each agent sees its own tools, never more than the global list
    assert [tool.name for tool in tool_entries(settings)] == ["boom", "echo"]
    assert [tool.name for tool in tool_entries(settings, "narrow")] == ["echo"]
    assert agent_of({"unstuck/agent": "narrow"}) == "narrow"
    assert agent_of(None) == agent_of({"unstuck/agent": " "}) == "main"
