"""The worker and the gateway on a Sentinel list follow the primary through a failover.

A real topology on loopback (tests/sentinel_harness.py): calls are answered through the
first primary, the primary is SIGKILLed, the Sentinels promote the replica, and calls keep
being answered, now through the new primary, without restarting anything.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from tests.harness import GatewayOn, WorkerOn, base_env
from tests.sentinel_harness import LocalSentinels
from workers import ToolCall, ToolGateway, ToolResult


@pytest.fixture
def sentinels() -> Iterator[LocalSentinels]:
    topology = LocalSentinels().start()
    yield topology
    topology.close()


def _echo(gateway: ToolGateway, run: str, text: str) -> list[ToolResult]:
    call = ToolCall(id=f"{run}-c", name="echo", arguments={"text": text})
    return gateway.call_tools(session_key="s1", run_id=run, calls=[call])


def _keys_on(port: int) -> int:
    client = redis.Redis(port=port, socket_timeout=1)
    try:
        return int(client.dbsize())
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_calls_are_answered_through_the_new_primary_after_a_failover(
    sentinels: LocalSentinels, worker_on: WorkerOn, gateway_on: GatewayOn
) -> None:
    # Given a worker and a gateway on the Sentinel list, answering through the first primary
    env = base_env(sentinels.url, UNSTUCK_REDIS__SENTINEL_MASTER=sentinels.master)
    worker_on(env)
    gateway = gateway_on(env)
    before = _echo(gateway, "before", "one")
    assert [(r.text, r.is_error) for r in before] == [("one", False)]
    # When the primary dies and the Sentinels promote its replica
    sentinels.kill_primary()
    killed = time.monotonic()
    sentinels.await_promotion()
    promoted_s = time.monotonic() - killed
    # Then calls are answered again, through the new primary, by the same worker and gateway
    after = [_echo(gateway, f"after{i}", f"t{i}") for i in range(5)]
    answered_s = time.monotonic() - killed
    assert [[(r.text, r.is_error) for r in results] for results in after] == [
        [(f"t{i}", False)] for i in range(5)
    ]
    assert _keys_on(sentinels.replica.port) > 0
    print(f"promotion {promoted_s:.1f}s after the kill; five calls answered {answered_s:.1f}s after it")
