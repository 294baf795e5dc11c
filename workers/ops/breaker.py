"""Prometheus metrics of the shared circuit breakers (``tools.breakers``), read on every scrape.

::

unstuck_breaker_open{tool}                  1 while the tool's circuit is open or half-open
unstuck_breaker_state{tool,state}           1 for the state the breaker is in (closed,
                                            open, half_open), 0 for the others
unstuck_breaker_recent_failures{tool}       the tool's failures within its window
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from workers.core.breaker import BreakerPolicy, BreakerState
from workers.errors import StoreError
from workers.store.breaker import BreakerStore
from workers.store.ledger import Ledger

__all__ = ["BreakerCollector"]

log = logging.getLogger(__name__)


class BreakerCollector(Collector):
    """One round trip per scrape for every configured breaker."""

    def __init__(
        self, ledger: Ledger, policies: Mapping[str, BreakerPolicy], *, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = BreakerStore(ledger)
        self.policies = dict(policies)
        self.clock = clock

    def describe(self) -> Iterable[Metric]:
        """Nothing: registering must not touch Redis."""
        return []

    def collect(self) -> Iterable[Metric]:
        """The breakers' families; nothing when Redis fails (``unstuck_up`` says so)."""
        try:
            rows = self.store.overview(self.policies, now_ms=int(self.clock() * 1000))
        except StoreError as exc:
            log.warning("metrics: cannot read the breakers: %s", exc)
            return
        opened = GaugeMetricFamily(
            "unstuck_breaker_open", "1 while the circuit is not closed", labels=["tool"]
        )
        states = GaugeMetricFamily("unstuck_breaker_state", "The breaker's state", labels=["tool", "state"])
        failures = GaugeMetricFamily(
            "unstuck_breaker_recent_failures", "Failures within the breaker's window", labels=["tool"]
        )
        for row in rows:
            tool, state = str(row["tool"]), str(row["state"])
            opened.add_metric([tool], float(state != BreakerState.CLOSED.value))
            for each in BreakerState:
                states.add_metric([tool, each.value], float(state == each.value))
            failures.add_metric([tool], float(str(row["recent_failures"])))
        yield from (opened, states, failures)
