"""Every failure path against a real redis-server and a real prefork worker.

Each test asserts exactly one result per call, the right reason, and arrival within the
call's deadline plus the gateway's grace.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.harness import Proc, base_env, processes_with_cmdline, send_by_hand, wait_until
from workers import ToolCall, ToolGateway, ToolResult
from workers.celery_edge.names import INVOKE_TASK
from workers.settings import Settings
from workers.store.keys import all_index_keys

GRACE_S = 2.0


@pytest.fixture
def env(redis_url: str) -> dict[str, str]:
    # Built-ins are off by default; these tests use them, so they enable them explicitly.
    return base_env(redis_url, UNSTUCK_TOOLS__BUILTINS="exec,http_fetch")


def _call(
    gateway: ToolGateway, *calls: ToolCall, session: str = "s1", run: str = "r1"
) -> tuple[list[ToolResult], float]:
    started = time.monotonic()
    results = gateway.call_tools(session_key=session, run_id=run, calls=list(calls))
    return results, time.monotonic() - started


def _assert_one_each(calls: tuple[ToolCall, ...], results: list[ToolResult]) -> None:
    assert [r.tool_call_id for r in results] == [c.id for c in calls]


def _deadline_s(gateway: ToolGateway, session: str, run: str, call_id: str) -> float:
    record = gateway._rt.ledger.record(gateway._rt.ledger.keys(session, run), call_id)
    assert record is not None
    return (int(record.fields["deadline_ms"]) - int(record.fields["submitted_ms"])) / 1000


@pytest.mark.timeout(60)
def test_healthy_calls_return_real_results(worker: Proc, gateway: ToolGateway) -> None:
    # Given two healthy calls
    calls = (
        ToolCall(id="c1", name="echo", arguments={"text": "ab", "times": 2}),
        ToolCall(id="c2", name="exec", arguments={"command": "echo out; echo err >&2; exit 3"}),
    )
    # When
    results, _ = _call(gateway, *calls)
    # Then
    _assert_one_each(calls, results)
    assert results[0].text == "abab"
    assert not results[0].is_error
    assert '"exit_code": 3' in results[1].text
    assert '"stdout": "out\\n"' in results[1].text


@pytest.mark.timeout(30)
def test_r5_invalid_arguments_and_unknown_tool_answer_immediately(gateway: ToolGateway) -> None:
    # Given no worker at all: these calls must not need one
    calls = (
        ToolCall(id="bad", name="echo", arguments={"text": 5, "nope": 1}),
        ToolCall(id="ghost", name="ecko", arguments={}),
    )
    # When
    results, elapsed = _call(gateway, *calls)
    # Then
    _assert_one_each(calls, results)
    assert [r.reason for r in results] == ["invalid_arguments", "unknown_tool"]
    assert "text" in results[0].text
    assert "nope" in results[0].text
    assert "echo" in results[1].text
    assert elapsed < 1.0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["sigkill", "segv", "exit"])
def test_r1_crashed_child_is_answered_from_the_main_process(
    worker: Proc, gateway: ToolGateway, how: str
) -> None:
    call = ToolCall(id=f"crash-{how}", name="crash", arguments={"how": how})
    results, elapsed = _call(gateway, call)
    _assert_one_each((call,), results)
    assert results[0].reason == "crashed"
    assert results[0].details["synthetic"] is True
    assert elapsed < 3.0, "a lost child is reported by the main process, not by the lease"


@pytest.mark.timeout(60)
def test_r2_soft_limit_gives_timeout_soft_promptly(worker: Proc, gateway: ToolGateway) -> None:
    call = ToolCall(id="hang", name="sleepy", arguments={"seconds": 30})
    results, elapsed = _call(gateway, call)
    assert results[0].reason == "timeout_soft"
    assert 1.0 <= elapsed < 1.0 + 1.0


@pytest.mark.timeout(60)
def test_r2_tool_ignoring_soft_limit_is_killed_at_hard_limit(worker: Proc, gateway: ToolGateway) -> None:
    call = ToolCall(id="stubborn", name="stubborn", arguments={"seconds": 30})
    results, elapsed = _call(gateway, call)
    assert results[0].reason == "timeout_hard"
    assert 2.0 <= elapsed < 2.0 + 1.5


@pytest.mark.timeout(60)
def test_exec_process_group_dies_with_a_soft_timeout(
    worker: Proc, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given exec limited to 1 s and a command that leaves a grandchild behind
    monkeypatch.setenv("UNSTUCK_TOOLS__TIMEOUTS_S", '{"exec": 1}')
    gateway = ToolGateway(Settings())
    marker = f"sleep {3000 + os.getpid() % 1000}.5"
    call = ToolCall(id="x", name="exec", arguments={"command": f"{marker} & {marker}; echo never"})
    # When
    results, _ = _call(gateway, call)
    gateway.close()
    # Then
    assert results[0].reason == "timeout_soft"
    wait_until(lambda: not processes_with_cmdline(marker), timeout_s=5, what="process group gone")


@pytest.mark.timeout(60)
def test_fallback_is_a_normal_result_when_a_noncritical_tool_times_out(
    worker: Proc, gateway: ToolGateway
) -> None:
    call = ToolCall(id="opt", name="optional_lookup", arguments={"seconds": 30})
    results, _ = _call(gateway, call)
    assert not results[0].is_error
    assert results[0].details["fallback"] is True
    assert results[0].text == '{"status": "unknown"}'


@pytest.mark.timeout(60)
def test_retry_policy_reruns_retryable_failures(worker: Proc, gateway: ToolGateway) -> None:
    call = ToolCall(id="flaky", name="flaky", arguments={"key": "k1", "failures": 2})
    results, _ = _call(gateway, call)
    assert results[0].text == "ok after 3"
    assert results[0].details["attempt"] == 3


@pytest.mark.timeout(60)
def test_tool_error_carries_type_and_message_only(worker: Proc, gateway: ToolGateway) -> None:
    call = ToolCall(id="boom", name="boom", arguments={"message": "disk full"})
    results, _ = _call(gateway, call)
    assert results[0].is_error
    assert results[0].text == "Tool 'boom' failed with ValueError: disk full"


@pytest.mark.timeout(60)
def test_silent_heartbeat_is_answered_heartbeat_timeout(worker: Proc, gateway: ToolGateway) -> None:
    # Given a tool that beats for 1 s and then goes silent (timeout 1.5 s)
    call = ToolCall(id="hb", name="beating", arguments={"seconds": 15, "stop_beating_after": 1.0})
    results, elapsed = _call(gateway, call)
    assert results[0].reason == "heartbeat_timeout"
    assert elapsed < 1.0 + 1.5 + 0.5 + 1.5


@pytest.mark.timeout(60)
def test_no_worker_running_gives_deadline_exceeded_within_grace(gateway: ToolGateway) -> None:
    call = ToolCall(id="lonely", name="echo", arguments={"text": "x"})
    results, elapsed = _call(gateway, call)
    deadline_s = _deadline_s(gateway, "s1", "r1", "lonely")
    assert results[0].reason == "deadline_exceeded"
    assert deadline_s - 0.1 <= elapsed <= deadline_s + GRACE_S


@pytest.mark.timeout(30)
def test_broker_down_at_dispatch_gives_dispatch_failed_quickly(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a broker URL where nothing listens (the ledger's Redis is up)
    monkeypatch.setenv("UNSTUCK_BROKER__URL", "redis://127.0.0.1:1/0")
    gateway = ToolGateway(Settings())
    call = ToolCall(id="nobroker", name="echo", arguments={"text": "x"})
    results, elapsed = _call(gateway, call)
    gateway.close()
    assert results[0].reason == "dispatch_failed"
    assert elapsed < 5.0


@pytest.mark.timeout(60)
def test_redelivered_message_for_a_finished_call_never_runs_again(worker: Proc, gateway: ToolGateway) -> None:
    # Given a finished call
    call = ToolCall(id="once", name="flaky", arguments={"key": "redeliver", "failures": 0})
    first, _ = _call(gateway, call)
    ledger = gateway._rt.ledger
    keys = ledger.keys("s1", "r1")
    record = ledger.record(keys, "once")
    assert record is not None
    assert record.fields["attempt"] == "1"
    # When the broker delivers the same message again
    send_by_hand(gateway._app, INVOKE_TASK, kwargs={"job": __import__("json").loads(record.fields["job"])})
    # Then the worker sees it finished: no second attempt, no late result, same answer
    wait_until(
        lambda: INVOKE_TASK in worker.log() and "succeeded" in worker.log().split("once")[-1],
        timeout_s=10,
        what="redelivered task handled",
    )
    after = ledger.record(keys, "once")
    assert after is not None
    assert after.fields["attempt"] == "1"
    assert ledger.late_results(keys, "once") == []
    assert after.result == first[0]


@pytest.mark.timeout(60)
def test_resubmitting_the_same_call_id_returns_the_stored_result(worker: Proc, gateway: ToolGateway) -> None:
    call = ToolCall(id="same", name="flaky", arguments={"key": "resubmit", "failures": 0})
    first, _ = _call(gateway, call)
    second, _ = _call(gateway, call)
    assert first == second
    assert first[0].text == "ok after 1"


@pytest.mark.timeout(60)
async def test_async_api_returns_results_in_call_order(worker: Proc, agateway: ToolGateway) -> None:
    calls = [ToolCall(id=f"a{i}", name="echo", arguments={"text": str(i)}) for i in range(5)]
    results = await agateway.acall_tools(session_key="s-async", run_id="r", calls=calls)
    assert [r.text for r in results] == ["0", "1", "2", "3", "4"]


@pytest.mark.timeout(60)
def test_every_key_written_expires(worker: Proc, gateway: ToolGateway) -> None:
    _call(gateway, ToolCall(id="ttl", name="echo", arguments={"text": "x"}), session="ttl", run="r")
    client = gateway._rt.ledger.client
    keys = [str(k) for k in client.scan_iter(match="unstuck:*")]
    assert keys
    ttls = {key: client.ttl(key) for key in keys}
    assert all(ttl > 0 for ttl in ttls.values()), ttls
    due = sum(client.zcard(index.due) for index in all_index_keys("unstuck"))
    assert due == 0, "answered calls leave the due index"
