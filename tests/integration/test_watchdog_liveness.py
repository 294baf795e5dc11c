"""The watchdog's liveness record: each completed sweep, the gaps between them, and its TTL."""

from __future__ import annotations

import threading
import time

import pytest

import workers.watchdog.service as service_module
from tests.harness import settings_of
from workers.celery_edge.app import create_app
from workers.runtime import Runtime, open_ledger
from workers.settings import Settings
from workers.store.events import recent_events
from workers.store.keys import watchdog_key
from workers.store.watchdog_liveness import RECORD_TTL_MS, WatchdogLiveness
from workers.watchdog.openclaw_sweep import OpenClawSweepReport
from workers.watchdog.operator_view import watchdog_warning
from workers.watchdog.service import WatchdogService

pytestmark = pytest.mark.timeout(30)


def test_sweeps_are_recorded_with_the_gap_before_each(settings: Settings) -> None:
    # Given a fresh ledger
    ledger = open_ledger(settings)
    liveness = WatchdogLiveness(ledger)
    assert liveness.last() is None
    # When three sweeps complete, 1 s and then 4 s apart
    gaps = [liveness.sweep_completed(now) for now in (10_000, 11_000, 15_000)]
    # Then the first has no gap, the others theirs, and the worst is kept
    assert gaps == [None, 1_000, 4_000]
    record = liveness.last()
    assert record is not None
    assert (record.last_sweep_ms, record.last_gap_ms, record.max_gap_ms, record.sweeps) == (
        15_000,
        4_000,
        4_000,
        3,
    )
    assert record.lag_ms(17_500) == 2_500
    ttl_ms = ledger.client.pttl(watchdog_key(ledger.prefix))
    assert 0 < ttl_ms <= RECORD_TTL_MS


def test_the_operator_is_warned_when_no_sweep_completed_lately(settings: Settings) -> None:
    # Given sweeps every 15 s, the last one at t=100 s
    liveness = WatchdogLiveness(open_ledger(settings))
    assert watchdog_warning(liveness.last(), now=0, interval_s=15) is not None  # never swept
    liveness.sweep_completed(100_000)
    record = liveness.last()
    # Then within two intervals nothing is said; after that a warning names the gap
    assert watchdog_warning(record, now=130_000, interval_s=15) is None
    warning = watchdog_warning(record, now=131_000, interval_s=15)
    assert warning is not None
    assert "31.0 s ago" in warning


def test_the_watchdog_service_alerts_when_a_sweep_comes_more_than_two_intervals_late(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the watchdog process's service, sweeps due every 100 ms, and its clock in hand
    settings = settings_of({**env, "UNSTUCK_WATCHDOG__INTERVAL_S": "0.1"})
    ledger = open_ledger(settings)
    app = create_app(settings, role="client")
    service = WatchdogService(app, Runtime(settings=settings, ledger=ledger, tools={}))
    clock = iter([10_000, 10_000, 10_150, 10_150, 10_650, 10_650])  # each sweep reads it twice
    monkeypatch.setattr(service_module, "now_ms", lambda: next(clock))
    # When three sweeps complete: the first, one on time (150 ms), one late (500 ms)
    for _ in range(3):
        service.sweep()
    # Then only the late one raised watchdog_late, on the events stream, with its gap
    late = [fields for _, fields in recent_events(ledger, 50) if fields.get("kind") == "watchdog_late"]
    assert [(f["gap_ms"], f["interval_ms"]) for f in late] == [("500", "100")]
    service.events.close(timeout_s=5)
    app.close()
    ledger.close()


def test_a_sweep_never_waits_on_the_openclaw_guard(env: dict[str, str]) -> None:
    # Given the watchdog's service whose OpenClaw guard hangs (a gateway RPC that never returns)
    settings = settings_of(env)
    ledger = open_ledger(settings)
    app = create_app(settings, role="client")
    service = WatchdogService(app, Runtime(settings=settings, ledger=ledger, tools={}))
    entered, release = threading.Event(), threading.Event()
    runs: list[int] = []

    def hung_guard(now_ms: int) -> OpenClawSweepReport:
        runs.append(now_ms)
        entered.set()
        release.wait(20)
        return OpenClawSweepReport()

    service.openclaw.sweep = hung_guard  # type: ignore[method-assign]
    try:
        # When two sweeps run while the guard is stuck in its first run
        started = time.monotonic()
        service.sweep()
        assert entered.wait(5)
        service.sweep()
        took_s = time.monotonic() - started
        # Then both sweeps completed at once and were recorded, and the busy guard was not run twice
        assert took_s < 2.0, took_s
        record = WatchdogLiveness(ledger).last()
        assert record is not None
        assert record.sweeps == 2
        assert len(runs) == 1
    finally:
        release.set()
        service.events.close(timeout_s=5)
        app.close()
        ledger.close()
