"""Concurrent batches of one run each wake on their own answers, not at the next check."""

from __future__ import annotations

import threading
import time

import pytest

from tests.harness import Proc
from workers import ToolCall, ToolGateway
from workers.settings import Settings

pytestmark = pytest.mark.timeout(90)

CHECK_INTERVAL_S = 5.0  # a missed wake-up would cost this long: far above a healthy echo


def test_two_batches_of_one_run_both_return_as_soon_as_answered(settings: Settings, worker: Proc) -> None:
    # Given a gateway that checks leases only every 5 s, and two threads sharing one run
    tuned = settings.model_copy(
        update={"gateway": settings.gateway.model_copy(update={"check_interval_s": CHECK_INTERVAL_S})}
    )
    gateway = ToolGateway(tuned)
    gateway.call_tools(
        session_key="shared", run_id="r1", calls=[ToolCall(id="warm", name="echo", arguments={"text": "w"})]
    )
    slowest: list[float] = []
    try:
        for round_ in range(5):
            took: list[float] = []

            def batch(n: int, round_: int = round_, took: list[float] = took) -> None:
                started = time.monotonic()
                call = ToolCall(id=f"r{round_}-{n}", name="echo", arguments={"text": str(n)})
                gateway.call_tools(session_key="shared", run_id="r1", calls=[call])
                took.append(time.monotonic() - started)

            # When both submit at once and each answer signals the run's one wake-up list
            threads = [threading.Thread(target=batch, args=(n,)) for n in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            slowest.append(max(took))
    finally:
        gateway.close()
    # Then neither waited for its next check to notice its answer
    assert max(slowest) < CHECK_INTERVAL_S / 2, slowest
