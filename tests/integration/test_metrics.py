"""Ledger metrics against a private redis-server: values written through ``Ledger``, then scraped."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from workers.cli.metrics_cmd import serve
from workers.core.models import SyntheticReason, ToolCall
from workers.core.refusal import RefusalReason
from workers.core.results import success_result, synthetic_result, tool_error_result
from workers.local.embedded_redis import free_port
from workers.ops.metrics import LedgerCollector
from workers.store.connection import connect
from workers.store.ledger import Ledger
from workers.store.refusal import count_refusal
from workers.store.sessions import AgentBeats, SessionStore, ensure_run
from workers.store.watchdog_liveness import WatchdogLiveness

NOW_MS = 1_800_000_000_000
PREFIX = "unstuck"


@pytest.fixture
def ledger(redis_url: str) -> Iterator[Ledger]:
    client = connect(redis_url, socket_timeout_s=2, socket_connect_timeout_s=1)
    yield Ledger(client, prefix=PREFIX, ttl_s=3600, lease_ttl_ms=10_000)
    client.close()


def scrape(ledger: Ledger, **kwargs: int) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(LedgerCollector(ledger, clock=lambda: NOW_MS / 1000, **kwargs))
    return registry


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def add_call(
    ledger: Ledger,
    session: str,
    call_id: str,
    tool: str,
    *,
    submitted_ago_s: float,
    started_ago_s: float | None,
) -> ToolCall:
    keys = ledger.keys(session, "r1")
    submitted = NOW_MS - int(submitted_ago_s * 1000)
    ledger.register(
        keys, call_id, now_ms=submitted, deadline_ms=NOW_MS + 60_000, fields={"tool": tool, "job_digest": "d"}
    )
    if started_ago_s is not None:
        ledger.claim(
            keys,
            call_id,
            worker_id="w1",
            now_ms=NOW_MS - int(started_ago_s * 1000),
            tool=tool,
            job_digest="d",
        )
    return ToolCall(id=call_id, name=tool)


def seed(ledger: Ledger) -> None:
    """Seven calls over two sessions: every outcome, three synthetic reasons, one running run."""
    s1 = ledger.keys("s1", "r1")
    ensure_run(ledger, s1, now_ms=NOW_MS - 90_000, deadline_ms=NOW_MS + 600_000, agent_id="main")
    s2 = ledger.keys("s2", "r1")
    ensure_run(ledger, s2, now_ms=NOW_MS - 90_000, deadline_ms=NOW_MS + 600_000, agent_id="main")
    finished = NOW_MS - 1000
    call = add_call(ledger, "s1", "ok", "exec", submitted_ago_s=5, started_ago_s=4)
    ledger.finish(s1, success_result(call, "fine", elapsed_ms=4000, attempt=1), now_ms=finished, writer="t")
    call = add_call(ledger, "s1", "soft", "exec", submitted_ago_s=40, started_ago_s=31)
    timeout = synthetic_result(call, SyntheticReason.TIMEOUT_SOFT, elapsed_ms=30_000, attempt=1)
    ledger.finish(s1, timeout, now_ms=finished, writer="t")
    call = add_call(ledger, "s1", "err", "exec", submitted_ago_s=2, started_ago_s=1.5)
    error = tool_error_result(call, "ValueError", "bad", elapsed_ms=500, attempt=1)
    ledger.finish(s1, error, now_ms=finished, writer="t")
    call = add_call(ledger, "s2", "late", "http_fetch", submitted_ago_s=10, started_ago_s=None)
    late = synthetic_result(call, SyntheticReason.DEADLINE_EXCEEDED, elapsed_ms=9000, attempt=0)
    ledger.finish(s2, late, now_ms=finished, writer="t")
    call = add_call(ledger, "s2", "typo", "frobnicate", submitted_ago_s=1, started_ago_s=None)
    ledger.finish(
        s2,
        synthetic_result(call, SyntheticReason.UNKNOWN_TOOL, elapsed_ms=0, attempt=0),
        now_ms=finished,
        writer="t",
    )
    add_call(ledger, "s1", "waiting", "exec", submitted_ago_s=60, started_ago_s=None)
    add_call(ledger, "s2", "busy", "http_fetch", submitted_ago_s=20, started_ago_s=19)
    # Completed last: a finished run refuses new calls (registration fencing)
    ledger.client.hset(s2.run, "status", "completed")


def test_scrape_counts_every_outcome_reason_and_duration(ledger: Ledger) -> None:
    # Given calls with every outcome written through the ledger
    seed(ledger)
    # When the collector is scraped
    registry = scrape(ledger)
    # Then calls are counted by tool and outcome
    assert value(registry, "unstuck_up") == 1
    expected_calls = {
        ("exec", "ok"): 1,
        ("exec", "synthetic"): 1,
        ("exec", "tool_error"): 1,
        ("exec", "pending"): 1,
        ("http_fetch", "synthetic"): 1,
        ("http_fetch", "running"): 1,
        ("<unknown>", "synthetic"): 1,
    }
    for (tool, outcome), count in expected_calls.items():
        assert value(registry, "unstuck_calls", tool=tool, outcome=outcome) == count, (tool, outcome)
    assert value(registry, "unstuck_calls", tool="frobnicate", outcome="synthetic") is None
    # And synthetic results by reason (a tool's own error is not synthetic)
    for reason in ("timeout_soft", "deadline_exceeded", "unknown_tool"):
        assert value(registry, "unstuck_synthetic_results", reason=reason) == 1
    assert value(registry, "unstuck_synthetic_results", reason="tool_error") is None
    # And durations of the calls that ran: 3 s, 30 s and 0.5 s
    assert value(registry, "unstuck_tool_duration_seconds_count", tool="exec") == 3
    assert value(registry, "unstuck_tool_duration_seconds_sum", tool="exec") == pytest.approx(33.5)
    assert value(registry, "unstuck_tool_duration_seconds_bucket", tool="exec", le="5") == 2
    assert value(registry, "unstuck_tool_duration_seconds_count", tool="http_fetch") is None
    # And the open work: two unanswered calls, the oldest submitted 60 s ago
    assert value(registry, "unstuck_pending_calls") == 2
    assert value(registry, "unstuck_oldest_pending_call_age_seconds") == pytest.approx(60.0)
    # And the runs
    assert value(registry, "unstuck_runs", status="running") == 1
    assert value(registry, "unstuck_runs", status="completed") == 1
    assert value(registry, "unstuck_running_sessions") == 1
    assert value(registry, "unstuck_scrape_truncated") == 0


def test_scrape_of_an_empty_ledger_is_all_zero(ledger: Ledger) -> None:
    registry = scrape(ledger)
    assert value(registry, "unstuck_up") == 1
    assert value(registry, "unstuck_pending_calls") == 0
    assert value(registry, "unstuck_oldest_pending_call_age_seconds") == 0
    assert value(registry, "unstuck_running_sessions") == 0
    assert value(registry, "unstuck_scrape_keys") == 0


def test_scrape_reads_at_most_max_keys(ledger: Ledger) -> None:
    # Given more keys than the scrape may read
    seed(ledger)
    total = ledger.client.dbsize()
    # When scraped with a small bound
    registry = scrape(ledger, max_keys=5)
    # Then it stops there and says so
    assert total > 5
    assert value(registry, "unstuck_scrape_keys") == 5
    assert value(registry, "unstuck_scrape_truncated") == 1


def test_redis_down_gives_up_zero_not_an_error() -> None:
    # Given nothing listening where the ledger should be
    client = connect(f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=0.2, socket_connect_timeout_s=0.2)
    down = Ledger(client, prefix=PREFIX, ttl_s=3600, lease_ttl_ms=10_000)
    # When scraped, Then the scrape succeeds and says the ledger is down
    registry = scrape(down)
    assert value(registry, "unstuck_up") == 0
    assert value(registry, "unstuck_calls") is None
    client.close()


def test_metrics_endpoint_serves_the_collector(ledger: Ledger) -> None:
    # Given the endpoint on a free loopback port
    seed(ledger)
    server, thread = serve(scrape(ledger), 0, "127.0.0.1")
    try:
        # When Prometheus scrapes it
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    # Then our metrics are in the exposition text
    assert "unstuck_up 1.0" in body
    assert 'unstuck_calls{outcome="running",tool="http_fetch"} 1.0' in body


def test_sessions_by_class_idle_streams_and_the_watchdogs_pulse(ledger: Ledger) -> None:
    # Given two running runs the watchdog classed, one of them with two idle model streams,
    # and a watchdog whose last sweep completed 4 s ago after a 3 s gap
    store = SessionStore(ledger)
    for session in ("busy", "quiet"):
        store.begin_run(session, "r1", "main", NOW_MS - 60_000, NOW_MS + 600_000)
    store.set_class([("busy", "r1", "active"), ("quiet", "r1", "stuck")])
    beats = AgentBeats(store)
    for _ in range(2):
        beats.stream_idle(ledger.keys("quiet", "r1"), now_ms=NOW_MS - 5_000)
    liveness = WatchdogLiveness(ledger)
    liveness.sweep_completed(NOW_MS - 7_000)
    liveness.sweep_completed(NOW_MS - 4_000)
    # When Prometheus scrapes
    registry = scrape(ledger)
    # Then
    assert value(registry, "unstuck_sessions", **{"class": "active"}) == 1
    assert value(registry, "unstuck_sessions", **{"class": "stuck"}) == 1
    assert value(registry, "unstuck_idle_streams") == 2
    assert value(registry, "unstuck_watchdog_last_sweep_age_seconds") == pytest.approx(4.0)
    assert value(registry, "unstuck_watchdog_max_sweep_gap_seconds") == pytest.approx(3.0)


def test_a_watchdog_that_never_swept_reads_minus_one(ledger: Ledger) -> None:
    assert value(scrape(ledger), "unstuck_watchdog_last_sweep_age_seconds") == -1


DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
METRIC_NAME = re.compile(r"\bunstuck_[a-z_]+\b")


def _served_names(ledger: Ledger) -> set[str]:
    seed(ledger)
    names: set[str] = set()
    for family in LedgerCollector(ledger, clock=lambda: NOW_MS / 1000).collect():
        names.add(family.name)
        if family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        if family.type == "counter":
            names.add(f"{family.name}_total")  # a counter's samples carry the suffix
    return names


def _unknown(expressions: list[str], served: set[str]) -> list[str]:
    return [
        f"{expr}: {name}" for expr in expressions for name in METRIC_NAME.findall(expr) if name not in served
    ]


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "unstuck-dashboard.json").read_text(encoding="utf-8"))
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def _alert_exprs() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "unstuck-alerts.yaml").read_text(encoding="utf-8"))
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def test_every_dashboard_panel_and_alert_queries_a_metric_the_exporter_serves(ledger: Ledger) -> None:
    served = _served_names(ledger)
    exprs = _dashboard_exprs() + _alert_exprs()
    assert len(exprs) >= 10
    assert all(METRIC_NAME.search(expr) for expr in exprs)  # every query names one of ours
    assert _unknown(exprs, served) == []
    # The dashboard shows what the issue asks for
    joined = " ".join(exprs)
    for name in ("unstuck_sessions", "unstuck_synthetic_results", "unstuck_watchdog_last_sweep_age_seconds"):
        assert name in joined
    assert "unstuck_idle_streams" in joined


def test_a_query_of_a_metric_nobody_serves_is_found(ledger: Ledger) -> None:
    served = _served_names(ledger)
    assert _unknown(["rate(unstuck_sessoins[5m])"], served) == [
        "rate(unstuck_sessoins[5m]): unstuck_sessoins"
    ]


def test_refused_messages_are_a_counter_by_reason(ledger: Ledger) -> None:
    # Given workers that refused two unregistered messages and one altered one
    for reason in (RefusalReason.UNREGISTERED, RefusalReason.UNREGISTERED, RefusalReason.MISMATCH):
        count_refusal(ledger.client, ledger.prefix, reason, ttl_s=60)
    # Then the scrape serves them as a counter, every reason present
    registry = scrape(ledger)
    assert value(registry, "unstuck_refused_messages_total", reason="unregistered") == 2
    assert value(registry, "unstuck_refused_messages_total", reason="mismatch") == 1
    assert value(registry, "unstuck_refused_messages_total", reason="undecodable") == 0
    assert 0 < ledger.client.ttl(f"{PREFIX}:refused") <= 60  # like every key, it expires


def test_answers_written_back_after_a_failover_are_counters(ledger: Ledger) -> None:
    from workers.store.keys import kept_answers_key

    # Given keepers that wrote back three lost answers and met one conflict
    ledger.client.incrby(kept_answers_key(ledger.prefix, "restored"), 3)
    ledger.client.incr(kept_answers_key(ledger.prefix, "conflict"))
    # Then the scrape serves both as counters
    registry = scrape(ledger)
    assert value(registry, "unstuck_answers_restored_total") == 3
    assert value(registry, "unstuck_answers_restore_conflicts_total") == 1
