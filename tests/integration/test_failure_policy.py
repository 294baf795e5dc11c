"""Fallbacks and fail-branches end to end: a real worker, a real gateway, a JSON5 config file."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import GatewayOn, Proc, WorkerOn, base_env, settings_in_env
from workers import ToolCall, ToolGateway
from workers.answering.service import Answers
from workers.core.models import SyntheticReason, ToolResult
from workers.core.results import deadline_result
from workers.runtime import open_ledger
from workers.servers.mcp_server import McpDoor
from workers.servers.mcp_sessions import CallTarget
from workers.settings import Settings
from workers.store.ledger import Ledger
from workers.store.records import CallField
from workers.watchdog.due_calls import sweep_due_calls

pytestmark = pytest.mark.timeout(120)

NOW_MS = 1_000_000  # the store's clock in tests that write records directly

CONFIG = """
// tools.* as an operator writes them (JSON5: comments, trailing commas, unquoted keys)
{
  tools: {
    timeouts: { noop: 0.2, },
    failBranch: { fetch_down: { tool: 'fetch_cached', }, },
    fallbacks: {
      boom: { value: { status: 'degraded' }, },
      noop: { value: 'no answer in time', reasons: ['deadline_exceeded'], },
      sleepy: { value: 'late', reasons: ['deadline_exceeded'], },
      stubborn: { value: 'gave up', },
    },
  },
}
"""


@pytest.fixture
def configured_env(redis_url: str, tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "unstuck.json5"
    path.write_text(CONFIG, encoding="utf-8")
    return base_env(redis_url, UNSTUCK_CONFIG=str(path))


@pytest.fixture
def configured_gateway(configured_env: dict[str, str], gateway_on: GatewayOn) -> ToolGateway:
    return gateway_on(configured_env)


@pytest.fixture
def configured_worker(configured_env: dict[str, str], worker_on: WorkerOn) -> Proc:
    return worker_on(configured_env)


def _call(gateway: ToolGateway, name: str, session: str, **arguments: object) -> ToolResult:
    [result] = gateway.call_tools(
        session_key=session, run_id="r1", calls=[ToolCall(id=f"{session}-1", name=name, arguments=arguments)]
    )
    stored = gateway._rt.ledger.results(gateway._rt.ledger.keys(session, "r1"), [result.tool_call_id])
    assert stored[result.tool_call_id].to_json() == result.to_json()  # delivered == ledger
    return result


def test_config_fail_branch_answers_a_down_api_with_the_cached_tool(
    configured_worker: Proc, configured_gateway: ToolGateway
) -> None:
    # Given tools.failBranch.fetch_down -> fetch_cached in the config file
    # When the agent calls fetch_down, which raises
    result = _call(configured_gateway, "fetch_down", "branch-config", url="https://api")
    # Then the one result is the branch's, naming it and why the first failed
    assert result.is_error is False
    assert result.text == "cached copy of https://api"
    assert result.tool_name == "fetch_down"
    assert result.details["answered_by"] == "fetch_cached"
    assert result.details["branch_reason"] == "tool_error"
    assert "ConnectionError" in result.details["first_error"]


def test_decorator_fail_branch_answers_a_soft_timeout_within_the_call(
    configured_worker: Proc, configured_gateway: ToolGateway
) -> None:
    # Given fetch_slow (soft limit 1s) declares fail_branch="fetch_cached" on timeout_soft
    result = _call(configured_gateway, "fetch_slow", "branch-timeout", url="u", seconds=10)
    # Then the branch answered inside the call's hard limit, not the timeout
    assert result.is_error is False
    assert result.text == "cached copy of u"
    assert result.details["answered_by"] == "fetch_cached"
    assert result.details["branch_reason"] == "timeout_soft"
    assert result.details["elapsed_ms"] < 4000


def test_config_fallback_answers_a_tool_error_as_a_normal_result(
    configured_worker: Proc, configured_gateway: ToolGateway
) -> None:
    result = _call(configured_gateway, "boom", "fallback-error", message="x")
    assert result.is_error is False
    assert result.text == '{"status": "degraded"}'
    assert result.details["fallback"] is True
    assert result.details["reason"] == "tool_error"


def test_config_fallback_answers_a_hard_kill_written_by_the_workers_main_process(
    configured_worker: Proc, configured_gateway: ToolGateway
) -> None:
    # stubborn ignores its soft limit and is killed at the hard one (answered outside the child)
    result = _call(configured_gateway, "stubborn", "fallback-hard", seconds=30)
    assert (result.is_error, result.text) == (False, "gave up")
    assert result.details["reason"] == "timeout_hard"


def test_fallback_for_chosen_reasons_leaves_other_failures_as_errors(
    configured_worker: Proc, configured_gateway: ToolGateway
) -> None:
    # sleepy's fallback covers deadline_exceeded only; a soft timeout stays an error
    result = _call(configured_gateway, "sleepy", "fallback-chosen", seconds=5)
    assert result.is_error is True
    assert result.reason == "timeout_soft"


def test_config_fallback_answers_a_deadline_no_worker_reached(configured_gateway: ToolGateway) -> None:
    # Given no worker at all: the gateway answers noop at its deadline, with the configured default
    result = _call(configured_gateway, "noop", "fallback-deadline")
    assert (result.is_error, result.text) == (False, "no answer in time")
    assert result.details["reason"] == "deadline_exceeded"
    assert result.details["fallback"] is True


def test_decorator_fallback_does_not_reach_answers_written_outside_the_worker(
    configured_env: dict[str, str], gateway_on: GatewayOn
) -> None:
    # optional_lookup's decorator fallback is known where tools run; a deadline the gateway
    # answers (no worker) stays an error unless tools.fallbacks sets one (docs/tools.md, "Fallbacks").
    env = {**configured_env, "UNSTUCK_TOOLS__TIMEOUTS_S": '{"optional_lookup": 0.2}'}
    result = _call(gateway_on(env), "optional_lookup", "decorator-outside", seconds=1)
    assert result.is_error is True
    assert result.reason == "deadline_exceeded"


@pytest.fixture
def configured_settings(configured_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    return settings_in_env(configured_env, monkeypatch)


@pytest.fixture
def plain_ledger(configured_settings: Settings) -> Iterator[Ledger]:
    ledger = open_ledger(configured_settings)
    yield ledger
    ledger.close()


def _register(ledger: Ledger, session: str, call_id: str, *, tool: str, deadline_ms: int) -> None:
    """A call submitted 5 s before NOW_MS and published (so the sweep only looks at its deadline)."""
    keys = ledger.keys(session, "r1")
    fields: dict[str, str] = {CallField.TOOL: tool, CallField.DISPATCHED: "1"}
    ledger.register(keys, call_id, now_ms=NOW_MS - 5000, deadline_ms=deadline_ms, fields=fields)


def _stored(ledger: Ledger, session: str, call_id: str) -> ToolResult:
    return ledger.results(ledger.keys(session, "r1"), [call_id])[call_id]


def test_the_ledger_stores_what_it_is_given_even_with_a_fallback_configured(plain_ledger: Ledger) -> None:
    # Given tools.fallbacks.stubborn (every reason), and a ledger opened on those settings
    _register(plain_ledger, "verbatim", "c1", tool="stubborn", deadline_ms=NOW_MS - 1)
    failure = deadline_result(
        ToolCall(id="c1", name="stubborn"), submitted_ms=NOW_MS - 5000, deadline_ms=NOW_MS
    )
    # When a failure the fallback covers is handed to it
    assert plain_ledger.finish(plain_ledger.keys("verbatim", "r1"), failure, now_ms=NOW_MS, writer="test")
    # Then it holds exactly that failure: applying the fallback is the writer's part
    assert _stored(plain_ledger, "verbatim", "c1").to_json() == failure.to_json()


def test_watchdog_answers_carry_the_config_fallback(
    configured_settings: Settings, plain_ledger: Ledger
) -> None:
    # Given an overdue call and an open one of stubborn, whose tools.fallbacks covers every reason
    _register(plain_ledger, "watched", "late", tool="stubborn", deadline_ms=NOW_MS - 1)
    _register(plain_ledger, "watched", "open", tool="stubborn", deadline_ms=NOW_MS + 60_000)
    # When the watchdog's sweep answers the overdue call and its run end cancels the other one
    answered = sweep_due_calls(plain_ledger, now_ms=NOW_MS, settings=configured_settings, writer="watchdog")
    answers = Answers(writer="wd", fallbacks=configured_settings.tools.failure_rules().fallbacks)
    keys = plain_ledger.keys("watched", "r1")
    answers.end_run(keys, SyntheticReason.CANCELLED, now_ms=NOW_MS, detail="").on(plain_ledger)
    # Then both hold the default value as a normal result, saying why
    assert answered == 1
    results = {cid: _stored(plain_ledger, "watched", cid) for cid in ("late", "open")}
    assert {cid: (r.is_error, r.text, r.reason) for cid, r in results.items()} == {
        "late": (False, "gave up", "deadline_exceeded"),
        "open": (False, "gave up", "cancelled"),
    }


def test_a_gateway_cancel_of_a_call_no_worker_holds_carries_the_config_fallback(
    configured_gateway: ToolGateway, plain_ledger: Ledger
) -> None:
    # Given a registered call of stubborn that no worker claimed
    _register(plain_ledger, "cancelled", "c1", tool="stubborn", deadline_ms=NOW_MS + 60_000)
    # When the agent cancels it
    assert configured_gateway.cancel("cancelled", "r1", "c1") == 1
    # Then the gateway stored the default, saying it was cancelled
    result = _stored(plain_ledger, "cancelled", "c1")
    assert (result.is_error, result.text, result.reason) == (False, "gave up", "cancelled")
    assert result.details["fallback"] is True


async def test_an_mcp_cancel_carries_the_config_fallback(
    configured_settings: Settings, plain_ledger: Ledger
) -> None:
    # Given the MCP door on settings with tools.fallbacks.stubborn, and a registered call of stubborn
    now_ms = int(time.time() * 1000)
    keys = plain_ledger.keys("mcp-cancel", "r1")
    plain_ledger.register(keys, "c1", now_ms=now_ms, deadline_ms=now_ms + 60_000, fields={"tool": "stubborn"})
    door = McpDoor.from_settings(configured_settings)
    try:
        # When the MCP client cancels it
        call = ToolCall(id="c1", name="stubborn", arguments={"seconds": 30})
        target = CallTarget("mcp-cancel", "r1", "main", "c1", named_run=True)
        answered = await asyncio.to_thread(door._cancelled_answer, target, call, now_ms)
    finally:
        await door.aclose()
    # Then the door stored the default and answered what the ledger holds
    stored = _stored(plain_ledger, "mcp-cancel", "c1")
    assert (stored.is_error, stored.text, stored.reason) == (False, "gave up", "cancelled")
    assert answered.to_json() == stored.to_json()


def test_an_open_circuit_is_answered_at_once_with_the_fallback(
    worker: Proc, env: dict[str, str], gateway_on: GatewayOn, tmp_path: Path
) -> None:
    # Given a shared breaker on fragile (opens after one failure) and a fallback for circuit_open only
    fallback = {"value": "served from cache", "reasons": ["circuit_open"]}
    extra = {
        "UNSTUCK_TOOLS__BREAKERS": '{"fragile": {"failures": 1}}',
        "UNSTUCK_TOOLS__FALLBACKS": json.dumps({"fragile": fallback}),
    }
    gateway = gateway_on({**env, **extra})
    flag = tmp_path / "down"
    flag.write_text("down")
    # When the upstream fails once (an error: the fallback does not cover tool_error)
    first = _call(gateway, "fragile", "breaker-1", down_flag=str(flag))
    # and the next call finds the circuit open
    second = _call(gateway, "fragile", "breaker-2", down_flag=str(flag))
    # Then the first is the tool's error and the second the default, still saying circuit_open
    assert (first.is_error, first.reason) == (True, "tool_error")
    assert (second.is_error, second.text, second.reason) == (False, "served from cache", "circuit_open")
    assert second.details["fallback"] is True
    assert "retry_after_s" in second.details
