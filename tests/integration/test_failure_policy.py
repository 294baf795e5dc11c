"""Fallbacks and fail-branches end to end: a real worker, a real gateway, a JSON5 config file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness import GatewayOn, Proc, WorkerOn, base_env
from workers import ToolCall, ToolGateway
from workers.core.failure_policy import FallbackRule
from workers.core.models import SyntheticReason, ToolResult
from workers.core.waiting import ReapRules, reaps
from workers.store.connection import connect
from workers.store.ledger import Ledger
from workers.store.sessions import SessionStore

pytestmark = pytest.mark.timeout(120)

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


def test_watchdog_and_reaper_answers_carry_the_config_fallback(redis_url: str) -> None:
    # Given a ledger built as every process builds it: with tools.fallbacks from settings
    client = connect(redis_url, socket_timeout_s=2, socket_connect_timeout_s=1)
    rule = FallbackRule({"status": "unknown"})
    ledger = Ledger(client, prefix="fb", ttl_s=3600, lease_ttl_ms=3000, fallbacks={"echo": rule})
    store = SessionStore(ledger)
    now = 1_000_000
    keys = ledger.keys("s", "r1")
    for call_id, deadline in (("late", now - 1), ("open", now + 60_000)):
        ledger.register(keys, call_id, now_ms=now - 5000, deadline_ms=deadline, fields={"tool": "echo"})
    try:
        # When the reaper answers the overdue call and the watchdog cancels the run's other call
        planned = reaps(ledger.open_calls(keys, ["late"]), ReapRules(0, can_redispatch=False), now_ms=now)
        ledger.reap(keys, planned, now_ms=now, writer="watchdog")
        store.answer_open_calls(
            "s", "r1", SyntheticReason.CANCELLED, now_ms=now, writer="watchdog", detail=""
        )
        # Then both hold the default value as a normal result, saying why
        results = ledger.results(keys, ["late", "open"])
        assert {cid: (r.is_error, r.text, r.reason) for cid, r in results.items()} == {
            "late": (False, '{"status": "unknown"}', "deadline_exceeded"),
            "open": (False, '{"status": "unknown"}', "cancelled"),
        }
    finally:
        client.close()


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
