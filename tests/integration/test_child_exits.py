"""A pool child that dies is reaped and replaced by the worker at once, not by Celery's 5 s timer.

Celery hears of a child's exit on the child's sentinel pipe, which can close before the child
can be reaped; the pool's upkeep then finds it alive, and the 5 s timer reaps and replaces it
later. Until then the dead child is a zombie and the pool runs a process short. Before
``celery_edge/child_exits.py``, 19 of 30 crashes in a row were answered by another path than
the worker's own ``WorkerLostError``, the pool's upkeep having missed the death.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import Proc, WorkerOn, wait_until
from workers import ToolCall, ToolGateway

# Half Celery's upkeep interval: a replacement later than this was left to the timer.
_REPLACED_WITHIN_S = 2.5


def _states(worker: Proc) -> dict[int, str]:
    """The worker main process's children and their states (``Z``: dead, not reaped yet)."""
    states = {}
    for pid in worker.children():
        try:
            states[pid] = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # reaped in between
    return states


@pytest.mark.timeout(120)
def test_every_crashed_child_is_reaped_and_replaced_at_once(worker: Proc, gateway: ToolGateway) -> None:
    pool_size = len(_states(worker))
    for n in range(6):
        # Given a call whose tool kills its own pool child
        call = ToolCall(id=f"c{n}", name="crash", arguments={"how": "sigkill"})
        (result,) = gateway.call_tools(session_key=f"exits-{n}", run_id="r", calls=[call])
        assert result.reason == "crashed"

        # Then the dead child is reaped and the pool is whole again long before Celery's timer
        def whole() -> bool:
            states = _states(worker)
            return "Z" not in states.values() and len(states) == pool_size

        wait_until(whole, timeout_s=_REPLACED_WITHIN_S, what=f"crash {n}: the pool reaped and refilled")


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
