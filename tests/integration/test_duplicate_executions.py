"""At least once, counted: a second execution is detected, counted, logged, and never delivered.

The result that lost the first-writer race never replaces the one delivered.

The first execution's lease is deleted from the test, as it lapses when its worker is lost
(a partitioned host, a stalled main process, a claim a failover discarded): the worker's
main process renews leases with ``XX``, so the lease stays gone while the tool keeps running.
The gateway then re-runs the idempotent call on the worker's other pool child.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.harness import WorkerOn, base_env, recorded_runs, wait_until
from workers import ToolGateway
from workers.core.idempotency import idempotency_key
from workers.core.models import ToolCall
from workers.ops.metrics import LedgerCollector
from workers.store.duplicates import duplicate_count


@pytest.fixture
def env(redis_url: str, runs_file: Path) -> dict[str, str]:
    return base_env(redis_url, RECORD_RUN_FILE=str(runs_file))


@pytest.mark.timeout(90)
def test_a_second_execution_is_counted_logged_and_never_replaces_the_delivered_result(
    env: dict[str, str], worker_on: WorkerOn, gateway: ToolGateway, runs_file: Path
) -> None:
    # Given a worker with two pool children, running an idempotent call whose first execution takes 8 s
    worker = worker_on(env, concurrency=2)
    ledger = gateway._rt.ledger
    keys = ledger.keys("dup", "r1")
    call = ToolCall(id="c1", name="record_attempt", arguments={"tag": "t", "first_for_s": 8})
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(gateway.call_tools, session_key="dup", run_id="r1", calls=[call])
        wait_until(lambda: len(recorded_runs(runs_file)) == 1, timeout_s=30, what="the first execution")
        # When its lease lapses while it runs
        assert ledger.client.delete(keys.lease("c1")) == 1
        [delivered] = answer.result(timeout=30)
    # Then the call ran again, with the same idempotency key and the next attempt
    key = idempotency_key("dup", "r1", "c1")
    assert recorded_runs(runs_file) == [f"t {key} 1", f"t {key} 2"]
    assert delivered.text == "t attempt 2"
    # and the second execution was counted, in Redis and in the metric
    assert duplicate_count(ledger.client, ledger.prefix) == 1
    registry = CollectorRegistry()
    registry.register(LedgerCollector(ledger))
    assert registry.get_sample_value("unstuck_duplicate_executions_total") == 1
    # and logged with both attempts
    logged = [line for line in worker.log().splitlines() if "duplicate execution of call 'c1'" in line]
    assert len(logged) == 1
    assert key in logged[0]
    assert "attempt 2 by " in logged[0]
    assert "attempt 1 was claimed by " in logged[0]
    # and when the first execution ends, its result is kept as late: the delivered one stands
    wait_until(lambda: bool(ledger.late_results(keys, "c1")), timeout_s=20, what="the first execution's end")
    assert [late.text for late in ledger.late_results(keys, "c1")] == ["t attempt 1"]
    assert ledger.results(keys, ["c1"])["c1"] == delivered
