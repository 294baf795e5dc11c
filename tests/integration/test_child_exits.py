"""A pool child that dies is reaped by the worker at once, not found by Celery's 5 s timer.

Celery hears of a child's exit on the child's sentinel pipe, which can close before the child
can be reaped; the pool's upkeep then finds it alive and the 5 s timer finds it dead later.
Meanwhile the gateway's own check answers its call about half a second after the death, so
which of the two answered tells whether the worker saw it: the worker's answer names
billiard's ``WorkerLostError``. Before ``celery_edge/child_exits.py`` 19 of 30 crashes in a
row were answered by the gateway.
"""

from __future__ import annotations

import time

import pytest

from tests.harness import Proc, WorkerOn
from workers import ToolCall, ToolGateway


@pytest.mark.timeout(120)
def test_every_crashed_child_is_reaped_and_answered_by_the_worker(worker: Proc, gateway: ToolGateway) -> None:
    # Given twelve calls in a row whose tool kills its own pool child
    answered_by: list[str] = []
    slowest = 0.0
    for n in range(12):
        call = ToolCall(id=f"c{n}", name="crash", arguments={"how": "sigkill"})
        started = time.monotonic()
        (result,) = gateway.call_tools(session_key=f"exits-{n}", run_id="r", calls=[call])
        slowest = max(slowest, time.monotonic() - started)
        assert result.reason == "crashed"
        answered_by.append(str(result.details.get("detail", ""))[:30])
    # Then the worker reaped each dead child itself and answered its call
    assert all(detail.startswith("WorkerLostError") for detail in answered_by), answered_by
    # And the pool was whole again for each next call: none waited behind a dead child
    assert slowest < 1.5


@pytest.mark.timeout(60)
def test_a_replacement_pool_child_handles_sigchld_by_default(
    env: dict[str, str], worker_on: WorkerOn, gateway: ToolGateway
) -> None:
    # Given a one-process pool whose child died and was replaced, forked from a main process
    # that catches SIGCHLD by then
    worker_on(env, concurrency=1)
    crash = ToolCall(id="c", name="crash", arguments={"how": "exit"})
    (crashed,) = gateway.call_tools(session_key="sigchld", run_id="r", calls=[crash])
    assert crashed.reason == "crashed"
    # Then the replacement, where tools start their own processes, does not run that handler
    ask = ToolCall(id="ask", name="sigchld_handling", arguments={})
    (result,) = gateway.call_tools(session_key="sigchld", run_id="r", calls=[ask])
    assert result.text == "default"
