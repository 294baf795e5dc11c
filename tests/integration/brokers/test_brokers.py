"""The backbone's key paths against each broker: Redis and RabbitMQ (quorum queues).

Each test asserts exactly one result per call, its reason, and arrival within the call's
deadline plus the gateway's grace.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.harness import Proc
from tests.integration.brokers.conftest import QUEUE, Broker
from workers import ToolCall, ToolGateway, ToolResult
from workers.settings import Settings

GRACE_S = 2.0


@pytest.fixture
def gateway(broker_settings: Settings) -> Iterator[ToolGateway]:
    gw = ToolGateway(broker_settings)
    yield gw
    gw.close()


def _call(gateway: ToolGateway, session: str, *calls: ToolCall) -> tuple[list[ToolResult], float]:
    started = time.monotonic()
    results = gateway.call_tools(session_key=session, run_id="r1", calls=list(calls))
    elapsed = time.monotonic() - started
    assert [r.tool_call_id for r in results] == [c.id for c in calls]
    return results, elapsed


def _deadline_s(gateway: ToolGateway, session: str, call_id: str) -> float:
    record = gateway._rt.ledger.record(gateway._rt.ledger.keys(session, "r1"), call_id)
    assert record is not None
    return (int(record.fields["deadline_ms"]) - int(record.fields["submitted_ms"])) / 1000


@pytest.mark.timeout(60)
def test_healthy_calls_return_real_results(broker: Broker, broker_worker: Proc, gateway: ToolGateway) -> None:
    calls = (
        ToolCall(id="c1", name="echo", arguments={"text": "ab", "times": 2}),
        ToolCall(id="c2", name="exec", arguments={"command": "echo out; exit 3"}),
    )
    results, elapsed = _call(gateway, f"{broker.name}-healthy", *calls)
    assert results[0].text == "abab"
    assert not results[0].is_error
    assert '"exit_code": 3' in results[1].text
    assert elapsed <= _deadline_s(gateway, f"{broker.name}-healthy", "c2") + GRACE_S


@pytest.mark.timeout(60)
def test_soft_limit_gives_timeout_soft(broker: Broker, broker_worker: Proc, gateway: ToolGateway) -> None:
    call = ToolCall(id="hang", name="sleepy", arguments={"seconds": 30})
    results, elapsed = _call(gateway, f"{broker.name}-soft", call)
    assert results[0].reason == "timeout_soft"
    assert elapsed <= _deadline_s(gateway, f"{broker.name}-soft", "hang") + GRACE_S


@pytest.mark.timeout(60)
def test_tool_ignoring_soft_limit_gives_timeout_hard(
    broker: Broker, broker_worker: Proc, gateway: ToolGateway
) -> None:
    call = ToolCall(id="stubborn", name="stubborn", arguments={"seconds": 30})
    results, elapsed = _call(gateway, f"{broker.name}-hard", call)
    assert results[0].reason == "timeout_hard"
    assert elapsed <= _deadline_s(gateway, f"{broker.name}-hard", "stubborn") + GRACE_S


@pytest.mark.timeout(60)
def test_crashed_child_gives_crashed(broker: Broker, broker_worker: Proc, gateway: ToolGateway) -> None:
    call = ToolCall(id="crash", name="crash", arguments={"how": "sigkill"})
    results, elapsed = _call(gateway, f"{broker.name}-crash", call)
    assert results[0].reason == "crashed"
    assert elapsed <= _deadline_s(gateway, f"{broker.name}-crash", "crash") + GRACE_S


@pytest.mark.timeout(60)
def test_no_worker_on_the_queue_gives_deadline_exceeded(
    broker: Broker, broker_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a queue no worker consumes
    monkeypatch.setenv("UNSTUCK_BROKER__QUEUE", f"{QUEUE}.idle")
    gateway = ToolGateway(Settings())
    try:
        call = ToolCall(id="lonely", name="echo", arguments={"text": "x"})
        results, elapsed = _call(gateway, f"{broker.name}-lonely", call)
        deadline_s = _deadline_s(gateway, f"{broker.name}-lonely", "lonely")
    finally:
        gateway.close()
    assert results[0].reason == "deadline_exceeded"
    assert elapsed <= deadline_s + GRACE_S


@pytest.mark.timeout(30)
def test_broker_down_at_dispatch_gives_dispatch_failed(
    broker: Broker, broker_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a broker URL of the same kind where nothing listens (the ledger's Redis is up)
    monkeypatch.setenv("UNSTUCK_BROKER__URL", broker.down_url())
    gateway = ToolGateway(Settings())
    try:
        call = ToolCall(id="nobroker", name="echo", arguments={"text": "x"})
        results, elapsed = _call(gateway, f"{broker.name}-down", call)
        deadline_s = _deadline_s(gateway, f"{broker.name}-down", "nobroker")
    finally:
        gateway.close()
    assert results[0].reason == "dispatch_failed"
    assert elapsed <= deadline_s + GRACE_S


@pytest.mark.timeout(90)
def test_rabbitmq_queue_is_a_quorum_queue(broker: Broker, broker_worker: Proc) -> None:
    if broker.name != "rabbitmq":
        pytest.skip("quorum queues are a RabbitMQ feature")
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmqctl not on PATH: cannot list queue types")
    vhost = broker.url.rsplit("/", 1)[-1] or "/"
    listed = subprocess.run(
        ["rabbitmqctl", "list_queues", "-q", "-p", vhost, "name", "type", "durable"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows = {line.split()[0]: line.split()[1:] for line in listed.stdout.splitlines() if line.strip()}
    assert rows.get(QUEUE) == ["quorum", "true"], listed.stdout
