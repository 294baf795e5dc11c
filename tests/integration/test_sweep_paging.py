"""The server-side run sweep pages each bucket: every due run judged exactly once per sweep.

With a page of two members, most buckets hold more due runs than one script call reads, so
the sweep must page on, skipping what earlier pages left in the quiet range (alerts, time-outs)
and not skipping what they moved out of it (runs found active).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.harness import CLUSTER_LEG, store_client
from workers.settings import Settings
from workers.store import sweep_scripts
from workers.store.ledger import Ledger
from workers.store.sessions import SessionStore
from workers.watchdog.alerts import AlertSink
from workers.watchdog.sweep import Watchdog

pytestmark = pytest.mark.skipif(CLUSTER_LEG, reason="the scripts path needs a single Redis node")

T0 = int(time.time() * 1000)
STALLED_MS = 120_000
RUNS = 300  # about 5 per bucket of 64


@pytest.fixture
def store(redis_url: str) -> Iterator[SessionStore]:
    client = store_client(redis_url)
    yield SessionStore(Ledger(client, prefix="p", ttl_s=3600, lease_ttl_ms=3000))
    client.close()


def test_every_due_run_is_judged_once_across_pages(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given runs quiet in the index: a third active in their records, a third silent, a third past deadline
    monkeypatch.setattr(sweep_scripts, "SWEEP_PAGE", 2)
    started = T0 - STALLED_MS - 60_000
    now = T0
    for n in range(RUNS):
        deadline = now - 1 if n % 3 == 2 else now + 3_600_000
        store.begin_run(f"s{n}", "r", "main", started, deadline)
        if n % 3 == 0:
            store.client.hset(store.ledger.keys(f"s{n}", "r").run, "progress_ms", now - 1000)
    settings = Settings(watchdog={"stalled_after_s": STALLED_MS / 1000})
    watchdog = Watchdog(store, settings, writer="wd", alerts=AlertSink(), server_side=True)
    # When one sweep runs
    report = watchdog.sweep(now)
    # Then each run was classed once: the active moved on, the silent alerted, the late timed out
    assert sum(report.classes.values()) == RUNS
    assert report.classes == {"active": RUNS // 3, "stuck": 2 * RUNS // 3}
    assert report.alerts == 2 * RUNS // 3
    assert report.timed_out == RUNS // 3
    # And a second sweep finds the silent runs already alerted, nothing more
    again = watchdog.sweep(now)
    assert again.alerts == again.timed_out == 0
    assert again.classes == {"stuck": RUNS // 3}
