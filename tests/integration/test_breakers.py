"""The shared circuit breaker with a real worker: opens across sessions, answers at once, recovers."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.harness import UNSTUCK, Proc, wait_until
from workers.core.models import ToolCall, ToolResult
from workers.gateway.client import ToolGateway
from workers.ops.breaker import BreakerCollector
from workers.store.events import recent_events
from workers.store.ledger import Ledger

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]

COOLDOWN_S = 1.5
POLICY = {"fragile": {"failures": 2, "window_s": 60, "cooldown_s": COOLDOWN_S, "half_open_probes": 1}}


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    return {**env, "UNSTUCK_TOOLS__BREAKERS": json.dumps(POLICY)}


@pytest.fixture
def down_flag(tmp_path: Path) -> Path:
    flag = tmp_path / "down"
    flag.touch()
    return flag


def call(gateway: ToolGateway, session: str, call_id: str, flag: Path) -> ToolResult:
    (result,) = gateway.call_tools(
        session_key=session,
        run_id="r1",
        calls=[ToolCall(id=call_id, name="fragile", arguments={"down_flag": str(flag)})],
    )
    return result


def breakers_cli(env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [UNSTUCK, "breakers", "--json"], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert isinstance(row, dict)
    return row


def breaker_events(ledger: Ledger) -> list[str]:
    return [fields["state"] for _, fields in recent_events(ledger, 100) if fields.get("kind") == "breaker"]


def test_the_breaker_opens_across_sessions_answers_at_once_and_a_probe_closes_it(
    worker: Proc, gateway: ToolGateway, ledger: Ledger, down_flag: Path, env: dict[str, str]
) -> None:
    # Given the tool's upstream is down: two sessions each see one failure
    assert call(gateway, "s1", "c1", down_flag).reason == "tool_error"
    assert call(gateway, "s2", "c1", down_flag).reason == "tool_error"
    # Then the circuit is open for every session: the next call is answered at once, never run
    began = time.monotonic()
    refused = call(gateway, "s1", "c2", down_flag)
    assert refused.reason == "circuit_open"
    assert refused.details["attempt"] == 0
    assert time.monotonic() - began < 0.5
    record = ledger.record(ledger.keys("s1", "r1"), "c2")
    assert record is not None
    assert record.fields.get("worker") is None  # no worker ever claimed it
    # And the state is visible: CLI, metrics, events
    row = breakers_cli(env)
    assert row["state"] == "open"
    assert row["recent_failures"] == 2
    metrics = {f.name: f for f in BreakerCollector(ledger, gateway.settings.tools.breakers).collect()}
    assert metrics["unstuck_breaker_open"].samples[0].value == 1
    assert breaker_events(ledger) == ["open"]
    # When the upstream recovers and the cooldown is over
    down_flag.unlink()
    wait_until(lambda: breakers_cli(env)["retry_after_s"] == 0, timeout_s=COOLDOWN_S + 10, what="cooldown")
    # Then one probe runs, succeeds, and closes the circuit for everyone
    assert call(gateway, "s2", "c2", down_flag).text == "up"
    assert breakers_cli(env)["state"] == "closed"
    assert call(gateway, "s1", "c3", down_flag).text == "up"
    assert breaker_events(ledger) == ["open", "half_open", "closed"]


def test_a_failed_probe_opens_the_circuit_again(
    worker: Proc, gateway: ToolGateway, ledger: Ledger, down_flag: Path, env: dict[str, str]
) -> None:
    # Given an open circuit whose cooldown is over, the upstream still down
    call(gateway, "s1", "c1", down_flag)
    call(gateway, "s2", "c1", down_flag)
    wait_until(lambda: breakers_cli(env)["retry_after_s"] == 0, timeout_s=COOLDOWN_S + 10, what="cooldown")
    # When the probe fails
    assert call(gateway, "s1", "c2", down_flag).reason == "tool_error"
    # Then the circuit is open again for a new cooldown
    assert call(gateway, "s2", "c2", down_flag).reason == "circuit_open"
    assert breakers_cli(env)["state"] == "open"
    assert breaker_events(ledger) == ["open", "half_open", "open"]


def test_tools_without_a_breaker_are_never_refused(
    worker: Proc, gateway: ToolGateway, ledger: Ledger
) -> None:
    for index in range(4):
        (result,) = gateway.call_tools(
            session_key="s1", run_id="r1", calls=[ToolCall(id=f"b{index}", name="boom", arguments={})]
        )
        assert result.reason == "tool_error"
    assert breaker_events(ledger) == []
