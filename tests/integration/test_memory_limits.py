"""Per-call memory limits against a real redis-server and a real prefork worker.

A call past its limit is answered ``out_of_memory`` (naming the limit) within seconds,
whether the pool child or a process it started does the allocating; the worker's main
process lives on, the next call runs, and a call inside its limit is unaffected. The
tools are ``tests.misbehaving_tools.memory_hog`` and ``memory_hog_child`` (256 MB each).
"""

from __future__ import annotations

import os
import time

import pytest
from prometheus_client import CollectorRegistry

from tests.harness import GatewayOn, Proc, WorkerOn, base_env
from tests.misbehaving_tools import MEMORY_LIMIT_MB
from workers import ToolCall, ToolGateway, ToolResult
from workers.ops.metrics import LedgerCollector
from workers.store.ledger import Ledger
from workers.worker.memory_cgroups import find_layout

# The worker inherits this process's cgroup: where none can be made here, none can there.
_NO_CGROUPS = find_layout(os.getpid())
needs_cgroups = pytest.mark.skipif(
    isinstance(_NO_CGROUPS, str), reason=f"no memory cgroup to nest in: {_NO_CGROUPS}"
)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="creating cgroups needs root (or a delegated one)")

ANSWER_WITHIN_S = 10.0
HOG_MB = 3072


def _one(gateway: ToolGateway, call: ToolCall) -> tuple[ToolResult, float]:
    started = time.monotonic()
    (result,) = gateway.call_tools(session_key="mem", run_id=call.id, calls=[call])
    return result, time.monotonic() - started


def _assert_out_of_memory(result: ToolResult, limit_mb: int, oom: str) -> None:
    assert result.reason == "out_of_memory", result.text
    assert result.is_error
    assert f"{limit_mb} MB" in result.text
    assert "Ask for less" in result.text
    assert result.details["memory_limit_mb"] == limit_mb
    assert result.details["oom"] == oom


def _assert_worker_serves(worker: Proc, gateway: ToolGateway, tag: str) -> None:
    assert worker.process.poll() is None, "the worker's main process died"
    result, _ = _one(gateway, ToolCall(id=f"next-{tag}", name="echo", arguments={"text": tag}))
    assert (result.reason, result.text) == (None, tag)


@pytest.fixture
def env(redis_url: str) -> dict[str, str]:
    return base_env(redis_url)


@pytest.fixture
def cgroup_gateway(
    env: dict[str, str], worker_on: WorkerOn, gateway_on: GatewayOn
) -> tuple[Proc, ToolGateway]:
    return worker_on(env), gateway_on(env)


@needs_root
@needs_cgroups
@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("tool", "oom"), [("memory_hog", "child_killed"), ("memory_hog_child", "process_killed")]
)
def test_a_call_past_its_limit_is_answered_out_of_memory_and_the_worker_serves_on(
    cgroup_gateway: tuple[Proc, ToolGateway], ledger: Ledger, tool: str, oom: str
) -> None:
    # Given a worker with a cgroup per call, and a tool limited to 256 MB allocating 3 GB
    worker, gateway = cgroup_gateway
    assert "a cgroup per call under" in worker.log()
    call = ToolCall(id=f"hog-{tool}", name=tool, arguments={"mb": HOG_MB})
    # When
    result, elapsed = _one(gateway, call)
    # Then: out_of_memory (the kernel's OOM kill in the call's cgroup, not `crashed`), promptly
    print(f"{tool}: {HOG_MB} MB under {MEMORY_LIMIT_MB} MB answered out_of_memory in {elapsed:.2f} s")
    _assert_out_of_memory(result, MEMORY_LIMIT_MB, oom)
    assert elapsed < ANSWER_WITHIN_S
    _assert_worker_serves(worker, gateway, tool)
    # And the metrics count it by its reason
    registry = CollectorRegistry()
    registry.register(LedgerCollector(ledger))
    assert registry.get_sample_value("unstuck_synthetic_results", {"reason": "out_of_memory"}) == 1


@needs_root
@needs_cgroups
@pytest.mark.timeout(90)
def test_calls_inside_their_limit_run_as_before_beside_one_past_it(
    cgroup_gateway: tuple[Proc, ToolGateway],
) -> None:
    # Given, at once on a 2-process pool: a hog and a child allocating well inside its limit
    worker, gateway = cgroup_gateway
    calls = [
        ToolCall(id="hog", name="memory_hog", arguments={"mb": HOG_MB}),
        ToolCall(id="fits-child", name="memory_hog_child", arguments={"mb": 64}),
    ]
    # When
    hog, fits = gateway.call_tools(session_key="mem", run_id="together", calls=calls)
    # Then the hog alone is stopped; the other call's own result arrives
    _assert_out_of_memory(hog, MEMORY_LIMIT_MB, "child_killed")
    assert not fits.is_error, fits.text
    assert '"returncode": 0' in fits.text
    assert '"stdout": "64"' in fits.text
    # And a pool child's own allocation inside its limit too
    result, _ = _one(gateway, ToolCall(id="fits", name="memory_hog", arguments={"mb": 64}))
    assert (result.is_error, result.text) == (False, "held 64 MB")
    _assert_worker_serves(worker, gateway, "after")


@needs_root
@needs_cgroups
@pytest.mark.timeout(60)
def test_the_config_overrides_the_tools_own_limit(
    env: dict[str, str], worker_on: WorkerOn, gateway_on: GatewayOn
) -> None:
    # Given tools.memory_limits_mb lowering memory_hog's 256 MB to 128 MB
    env = {**env, "UNSTUCK_TOOLS__MEMORY_LIMITS_MB": '{"memory_hog": 128}'}
    worker_on(env)
    gateway = gateway_on(env)
    # When 200 MB is asked for (inside 256, past 128)
    result, _ = _one(gateway, ToolCall(id="hog-128", name="memory_hog", arguments={"mb": 200}))
    # Then
    _assert_out_of_memory(result, 128, "child_killed")


@pytest.mark.timeout(60)
def test_without_cgroups_the_rlimit_turns_the_allocation_into_out_of_memory(
    env: dict[str, str], worker_on: WorkerOn, gateway_on: GatewayOn
) -> None:
    # Given a worker told not to use cgroups: RLIMIT_DATA alone bounds the pool child
    env = {**env, "UNSTUCK_LIMITS__MEMORY_CGROUPS": "false"}
    worker = worker_on(env)
    gateway = gateway_on(env)
    # When the tool allocates 3 GB in its own process (MemoryError under the rlimit)
    result, elapsed = _one(gateway, ToolCall(id="hog-rlimit", name="memory_hog", arguments={"mb": HOG_MB}))
    # Then out_of_memory, not tool_error; the fallback was logged once; the limit was lifted after
    print(f"rlimit: {HOG_MB} MB under {MEMORY_LIMIT_MB} MB answered out_of_memory in {elapsed:.2f} s")
    _assert_out_of_memory(result, MEMORY_LIMIT_MB, "allocation_refused")
    assert elapsed < ANSWER_WITHIN_S
    assert worker.log().count("falling back to rlimits") == 1
    fits, _ = _one(gateway, ToolCall(id="fits-rlimit", name="memory_hog", arguments={"mb": 200}))
    assert (fits.is_error, fits.text) == (False, "held 200 MB")
    _assert_worker_serves(worker, gateway, "rlimit")
