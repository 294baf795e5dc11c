"""Sessions against a real redis-server: lane lock, fencing, supersede, indexes, TTLs, sweep."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from tests.harness import CLUSTER_LEG, is_cluster, store_client
from workers.answering.service import Answers
from workers.core.models import SyntheticReason, ToolCall
from workers.core.results import synthetic_result
from workers.core.run_health import RunStatus
from workers.errors import StoreError
from workers.local.embedded_redis import EmbeddedRedis, free_port
from workers.settings import Settings
from workers.store.keys import RunKeys, SessionKeys, all_index_keys, run_member, sweep_lock_key
from workers.store.ledger import Ledger
from workers.store.sessions import SessionStore, ensure_run
from workers.watchdog.alerts import AlertSink
from workers.watchdog.sweep import SweepReport, Watchdog, clean_stale_lanes, stale_lanes

T0 = int(time.time() * 1000)  # lanes expire at absolute times: use the real clock
MIN = 60_000
# The scripts path reads many slots in one script: a single node's only (a cluster refuses it).
SWEEP_PATHS = (False,) if CLUSTER_LEG else (True, False)


@pytest.fixture
def store(redis_url: str) -> Iterator[SessionStore]:
    client = store_client(redis_url)
    yield SessionStore(Ledger(client, prefix="t", ttl_s=3600, lease_ttl_ms=3000))
    client.close()


def _register(store: SessionStore, session: str, run: str, call_id: str, deadline_ms: int) -> None:
    keys = store.ledger.keys(session, run)
    store.ledger.register(
        keys,
        call_id,
        now_ms=T0,
        deadline_ms=deadline_ms,
        fields={"tool": "echo", "dispatched": "1", "job_digest": "d"},
    )


def _holds_lane(store: SessionStore, session_key: str, run_id: str, token: int) -> bool:
    """Whether ``run_id`` still holds its session's lane with ``token`` (the fencing check)."""
    lane = store.lane(session_key)
    return lane is not None and (lane.run_id, lane.token) == (run_id, token)


def test_lane_is_idempotent_for_its_holder(store: SessionStore) -> None:
    # Given / When
    first = store.begin_run("s", "r1", "main", T0, T0 + 30 * MIN)
    again = store.begin_run("s", "r1", "main", T0 + 5, T0 + 30 * MIN)
    # Then
    assert first == again >= 1
    lane = store.lane("s")
    assert lane is not None
    assert (lane.run_id, lane.token) == ("r1", first)
    assert _holds_lane(store, "s", "r1", first)


def test_a_newer_run_supersedes_and_fences_the_old_one(store: SessionStore) -> None:
    # Given an old run with one unanswered call
    old = store.begin_run("s", "r1", "main", T0, T0 + 30 * MIN)
    _register(store, "s", "r1", "c1", T0 + MIN)
    # When a new run of the same session begins (the gateway answers the old run's calls)
    answers = Answers(writer="gw", fallbacks={})

    def answer_superseded(keys: RunKeys) -> object:
        return answers.end_run(keys, SyntheticReason.CANCELLED, now_ms=T0 + 10, detail="").on(store.ledger)

    new = store.begin_run("s", "r2", "main", T0 + 10, T0 + 30 * MIN, answer_superseded=answer_superseded)
    # Then the old run is aborted, its call answered cancelled, and it can no longer write
    assert new > old
    info = store.run("s", "r1")
    assert info is not None
    assert (info.status, info.end_reason) == ("aborted", "superseded")
    result = store.ledger.results(store.ledger.keys("s", "r1"), ["c1"])["c1"]
    assert result.reason == SyntheticReason.CANCELLED.value
    assert not store.touch_progress("s", "r1", T0 + 20)
    assert not store.end_run("s", "r1", RunStatus.COMPLETED, T0 + 20)
    assert not _holds_lane(store, "s", "r1", old)
    assert _holds_lane(store, "s", "r2", new)
    assert store.begin_run("s", "r1", "main", T0 + 30, T0 + 30 * MIN) == 0


def test_tokens_keep_growing_after_the_counter_expired(store: SessionStore) -> None:
    # Given a held lane whose fence counter was lost
    token = store.begin_run("s", "r1", "main", T0, T0 + 30 * MIN)
    store.client.delete(SessionKeys("t", "s").fence)
    # When
    newer = store.begin_run("s", "r2", "main", T0 + 1, T0 + 30 * MIN)
    # Then
    assert newer > token


def test_indexes_follow_the_run(store: SessionStore) -> None:
    # Given
    store.begin_run("s", "r1", "main", T0, T0 + 30 * MIN)
    member = run_member("s", "r1")
    index = store.ledger.keys("s", "r1").index
    # When progress is reported, even out of order
    assert store.touch_progress("s", "r1", T0 + 500)
    assert store.touch_progress("s", "r1", T0 + 100)
    # Then
    assert store.client.zscore(index.by_progress, member) == T0 + 500
    assert store.client.zscore(index.by_deadline, member) == T0 + 30 * MIN
    assert [r for _, r, _ in store.quiet_since(T0 + 500, 10)] == ["r1"]
    assert store.quiet_since(T0 + 499, 10) == []
    # When the run ends
    assert store.end_run("s", "r1", RunStatus.COMPLETED, T0 + 600)
    # Then it leaves the running indexes and its lane is free
    assert store.client.zscore(index.by_progress, member) is None
    assert store.client.zscore(index.by_deadline, member) is None
    assert store.client.zscore(index.ended, member) == T0 + 600
    assert store.lane("s") is None


def test_the_ledger_run_record_and_the_session_agree(store: SessionStore) -> None:
    # Given the gateway's ensure_run after begin_run (both write the run hash)
    store.begin_run("s", "r1", "main", T0, T0 + 30 * MIN)
    keys = store.ledger.keys("s", "r1")
    # When
    deadline = ensure_run(store.ledger, keys, now_ms=T0 + 1, deadline_ms=T0 + 99 * MIN, agent_id="main")
    # Then the first deadline stands
    assert deadline == T0 + 30 * MIN


def test_every_key_written_has_a_ttl(store: SessionStore, redis_url: str) -> None:
    # Given a run with a call, superseded, and a sweep lock held
    store.begin_run("s", "r1", "main", T0, T0 + 30 * MIN)
    _register(store, "s", "r1", "c1", T0 + MIN)
    store.begin_run("s", "r2", "main", T0 + 1, T0 + 30 * MIN)
    store.try_sweep_lock("tok", 30_000)
    # When / Then: only the documented global indexes live without a TTL
    client = store_client(redis_url)
    no_ttl_allowed = {k for i in all_index_keys("t") for k in (i.by_deadline, i.by_progress, i.ended, i.due)}
    for key in client.scan_iter("t:*"):
        if key not in no_ttl_allowed:
            assert client.pttl(key) > 0, key
    client.close()


def test_sweep_lock_is_exclusive_and_token_checked(store: SessionStore) -> None:
    assert store.try_sweep_lock("a", 30_000)
    assert not store.try_sweep_lock("b", 30_000)
    assert not store.release_sweep_lock("b")
    assert store.release_sweep_lock("a")
    assert store.try_sweep_lock("b", 30_000)


def test_a_sweep_that_redis_left_mid_way_does_not_lock_out_the_sweeps_after_it(tmp_path: Path) -> None:
    # Given a watchdog on a Redis that keeps its keys through a restart (as the sweep lock is)
    with EmbeddedRedis(port=free_port(), appendonly=True, data_dir=str(tmp_path)) as server:
        client = store_client(server.url)
        store = SessionStore(Ledger(client, prefix="t", ttl_s=3600, lease_ttl_ms=3000))
        watchdog = Watchdog(store, Settings(), writer="wd", alerts=AlertSink())
        sweep = watchdog._sweep

        def redis_stops(now_ms: int) -> SweepReport:
            server.stop()
            return sweep(now_ms)

        # When Redis stops in the middle of a sweep, so its lock is never released, and comes back
        watchdog._sweep = redis_stops  # type: ignore[method-assign]
        with pytest.raises(StoreError):
            watchdog.sweep(T0)
        server.start()
        assert client.exists(sweep_lock_key("t")), "the restart kept the lock"
        watchdog._sweep = sweep  # type: ignore[method-assign]
        # Then the next sweep runs rather than waiting out the lock's TTL
        assert not watchdog.sweep(T0 + 1000).locked_out
        client.close()


def _watchdog(store: SessionStore, *, recover: bool) -> tuple[Watchdog, list[dict[str, object]]]:
    sent: list[dict[str, object]] = []
    sink = AlertSink()
    sink.emit = sent.append  # type: ignore[method-assign,assignment]
    settings = Settings(watchdog={"stalled_after_s": 120, "auto_recover": recover})
    return Watchdog(store, settings, writer="wd", alerts=sink), sent


def test_sweep_times_out_runs_past_their_deadline(store: SessionStore) -> None:
    # Given a run whose budget ends before its call's deadline
    store.begin_run("s", "r1", "main", T0, T0 + MIN)
    _register(store, "s", "r1", "c1", T0 + 5 * MIN)
    watchdog, _ = _watchdog(store, recover=False)
    # When
    report = watchdog.sweep(T0 + MIN)
    # Then
    assert report.timed_out == 1
    info = store.run("s", "r1")
    assert info is not None
    assert info.status == "timed_out"
    result = store.ledger.results(store.ledger.keys("s", "r1"), ["c1"])["c1"]
    assert result.reason == SyntheticReason.DEADLINE_EXCEEDED.value
    assert store.lane("s") is None


def test_sweep_alerts_once_on_stuck_and_recovers_when_asked(store: SessionStore) -> None:
    # Given a run with a queued call nobody runs, quiet past the threshold
    store.begin_run("s", "r1", "main", T0, T0 + 60 * MIN)
    _register(store, "s", "r1", "c1", T0 + 50 * MIN)
    watchdog, sent = _watchdog(store, recover=False)
    # When two sweeps run without recovery
    watchdog.sweep(T0 + 3 * MIN)
    watchdog.sweep(T0 + 4 * MIN)
    # Then one alert, nothing changed
    assert [a["kind"] for a in sent] == ["session.stuck"]
    assert store.lane("s") is not None
    # When recovery is on
    recovering, _ = _watchdog(store, recover=True)
    report = recovering.sweep(T0 + 5 * MIN)
    # Then
    assert report.recovered == 1
    assert store.lane("s") is None
    result = store.ledger.results(store.ledger.keys("s", "r1"), ["c1"])["c1"]
    assert result.reason == SyntheticReason.CANCELLED.value


def test_sweep_reads_real_activity_and_moves_the_index(store: SessionStore) -> None:
    # Given a run whose call heartbeats (the gateway wrote nothing since the start)
    store.begin_run("s", "r1", "main", T0, T0 + 60 * MIN)
    _register(store, "s", "r1", "c1", T0 + 50 * MIN)
    keys = store.ledger.keys("s", "r1")
    store.ledger.claim(keys, "c1", worker_id="w:1", now_ms=T0 + 1, tool="echo", job_digest="d")
    store.client.set(keys.lease("c1"), "w:1", px=60_000)
    store.ledger.heartbeat(keys, "c1", now_ms=T0 + 5 * MIN, details={})
    watchdog, sent = _watchdog(store, recover=True)
    # When
    report = watchdog.sweep(T0 + 6 * MIN)
    # Then
    assert report.classes == {"long_running": 1}
    assert sent == []
    by_progress = store.ledger.keys("s", "r1").index.by_progress
    assert store.client.zscore(by_progress, run_member("s", "r1")) == T0 + 5 * MIN


def test_a_runs_progress_is_never_earlier_than_its_start(store: SessionStore) -> None:
    # The run sweep script reads progress_ms alone as the run's latest activity (judge() takes
    # the later of it and started_ms): every write path must keep progress_ms >= started_ms,
    # whatever the writers' clocks say.
    # Given a run opened by a host whose clock is ahead of everyone else's
    store.begin_run("s", "r1", "main", T0, T0 + 60 * MIN)
    keys = store.ledger.keys("s", "r1")

    def progress_and_start() -> tuple[int, int]:
        progress, started = store.client.hmget(keys.run, ["progress_ms", "started_ms"])
        assert progress is not None
        assert started is not None
        return int(progress), int(started)

    assert progress_and_start() == (T0, T0)
    # When every writer reports from a clock behind the start
    store.touch_progress("s", "r1", T0 - 9_000)
    _register(store, "s", "r1", "c1", T0 + 50 * MIN)  # registered at T0 itself
    store.ledger.register(
        keys, "c2", now_ms=T0 - 8_000, deadline_ms=T0 + MIN,
        fields={"tool": "echo", "dispatched": "1", "job_digest": "d"},
    )  # fmt: skip
    store.ledger.claim(keys, "c2", worker_id="w:1", now_ms=T0 - 7_000, tool="echo", job_digest="d")
    store.ledger.heartbeat(keys, "c2", now_ms=T0 - 6_000, details={})
    store.begin_run("s", "r1", "main", T0 - 5_000, T0 + 60 * MIN)  # the same run again
    # Then the start is kept and the progress never went below it
    assert progress_and_start() == (T0, T0)
    # And a later report moves the progress, never the start
    store.ledger.heartbeat(keys, "c2", now_ms=T0 + 7, details={})
    assert progress_and_start() == (T0 + 7, T0)


def test_stale_lanes_are_found_and_cleaned(store: SessionStore) -> None:
    # Given one live lane and one whose run record vanished
    store.begin_run("live", "r1", "main", T0, T0 + 60 * MIN)
    store.begin_run("gone", "r1", "main", T0, T0 + 60 * MIN)
    store.client.delete(store.ledger.keys("gone", "r1").run)
    # When
    stale = stale_lanes(store, T0 + 1)
    cleaned = clean_stale_lanes(store, T0 + 1)
    # Then
    assert [(lane.session_key, why) for lane, why in stale] == [("gone", "run record gone")]
    assert cleaned == 1
    assert store.lane("gone") is None
    assert store.lane("live") is not None


def _mixed_runs(store: SessionStore) -> None:
    """One run of every kind the sweep tells apart, including ids that need quoting."""
    led = store.ledger
    for session in ("active", "long", "s p{x}/é", "stalled", "stuck", "late", "gone", "ended", "lost"):
        deadline = T0 + MIN if session == "late" else T0 + 60 * MIN
        store.begin_run(session, "r1", "main", T0, deadline)
    _register(store, "active", "r1", "c1", T0 + 50 * MIN)
    done = synthetic_result(
        ToolCall(id="c1", name="echo"), SyntheticReason.CANCELLED, elapsed_ms=1, attempt=1
    )
    led.finish(led.keys("active", "r1"), done, now_ms=T0 + 5 * MIN, writer="w")
    for session, call_id, beat in (("long", "c1", T0 + 5 * MIN), ("s p{x}/é", "c:1/é", T0 + 5 * MIN),
                                   ("stalled", "c1", T0 + MIN), ("lost", "c1", T0 + 5 * MIN)):  # fmt: skip
        _register(store, session, "r1", call_id, T0 + 50 * MIN)
        keys = led.keys(session, "r1")
        led.claim(keys, call_id, worker_id="w:1", now_ms=T0 + 1, tool="echo", job_digest="d")
        store.client.set(keys.lease(call_id), "w:1", px=60_000 if session != "lost" else 1)
        led.heartbeat(keys, call_id, now_ms=beat, details={})
    _register(store, "stuck", "r1", "c1", T0 + 50 * MIN)
    _register(store, "late", "r1", "c1", T0 + 50 * MIN)
    store.client.delete(led.keys("gone", "r1").run)
    store.end_run("ended", "r1", RunStatus.COMPLETED, T0 + 1)
    store.client.zadd(led.keys("ended", "r1").index.by_progress, {run_member("ended", "r1"): T0})
    store.client.zadd(led.keys("gone", "r1").index.due, {led.keys("gone", "r1").due_member("x"): T0})


def _state(store: SessionStore) -> dict[str, object]:
    runs = {}
    for session in ("active", "long", "s p{x}/é", "stalled", "stuck", "late", "gone", "ended", "lost"):
        keys = store.ledger.keys(session, "r1")
        record = store.client.hgetall(keys.run)
        calls = [str(c) for c in store.client.zrange(keys.calls, 0, -1)]
        results = store.ledger.results(keys, calls)
        runs[session] = (
            {k: record.get(k) for k in ("status", "class", "end_reason")},
            store.client.zscore(keys.index.by_progress, run_member(session, "r1")),
            store.client.zscore(keys.index.by_deadline, run_member(session, "r1")),
            {c: (r.reason if r else None) for c, r in results.items()},
            store.lane(session) is not None,
        )
    return {
        "runs": runs,
        "due": sorted(m for i in all_index_keys(store.prefix) for m in store.client.zrange(i.due, 0, -1)),
        "leases": sorted(
            m for i in all_index_keys(store.prefix) for m in store.client.zrange(i.leases, 0, -1)
        ),
    }


def test_server_side_sweep_matches_the_pipelined_sweep(redis_url: str) -> None:
    # Given the same runs under two prefixes, one swept by scripts, one pipelined
    client = store_client(redis_url)
    seen: dict[bool, tuple[list[SweepReport], list[dict[str, object]], dict[str, object]]] = {}
    for server_side in SWEEP_PATHS:
        store = SessionStore(Ledger(client, prefix=f"p{int(server_side)}", ttl_s=3600, lease_ttl_ms=3000))
        _mixed_runs(store)
        reports: list[SweepReport] = []
        sent: list[dict[str, object]] = []
        # When three sweeps run, the last one recovering stuck runs
        for now, recover in ((T0 + 6 * MIN, False), (T0 + 7 * MIN, False), (T0 + 8 * MIN, True)):
            sink = AlertSink()
            sink.emit = sent.append  # type: ignore[method-assign,assignment]
            settings = Settings(watchdog={"stalled_after_s": 120, "auto_recover": recover})
            watchdog = Watchdog(store, settings, writer="wd", alerts=sink, server_side=server_side)
            assert (watchdog.scripts is not None) is server_side
            report = watchdog.sweep(now)
            report.phases_ms.clear()
            reports.append(report)
        seen[server_side] = (reports, sent, _state(store))
    # Then reports, alerts and stored state are the same
    first, *others = seen.values()
    assert all(other == first for other in others)
    reports = first[0]
    assert [
        (r.classes, r.timed_out, r.recovered, r.alerts, r.dropped, r.calls_answered) for r in reports
    ] == [
        ({"long_running": 2, "active": 2, "stuck": 2, "stalled": 1}, 1, 0, 3, 2, 1),
        ({"stalled": 3, "stuck": 2}, 0, 0, 3, 0, 0),
        ({"stalled": 3, "stuck": 3}, 0, 3, 1, 0, 0),
    ]
    client.close()


def test_the_store_is_on_the_cluster_exactly_on_the_cluster_leg(store: SessionStore, redis_url: str) -> None:
    # Given the store every test of this leg uses
    client: Any = store.client
    # Then on the cluster leg it is a cluster client on three masters, and the sweep takes the
    # pipelined path by itself; elsewhere it is a single node, swept by scripts
    assert is_cluster(redis_url) is CLUSTER_LEG
    assert isinstance(client, RedisCluster) is CLUSTER_LEG
    if CLUSTER_LEG:
        assert len(client.get_primaries()) == 3
        assert client.cluster_info()["cluster_state"] == "ok"
    watchdog = Watchdog(store, Settings(), writer="wd", alerts=AlertSink())
    assert (watchdog.scripts is None) is CLUSTER_LEG


def _round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts what the store sends to Redis, one item per round trip (a pipeline is one).

    A connection's own health-check ``PING`` (sent with ``check_health=False`` after 5 s idle)
    is not the store's round trip, and is not counted.
    """
    sent: list[int] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        if check_health:
            sent.append(1)
        send(self, command, check_health)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    return sent


@pytest.mark.skipif(CLUSTER_LEG, reason="a cluster sends each node its share of the round trip")
def test_a_run_begins_in_three_round_trips_and_ends_in_one(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.begin_run("warm", "r0", "main", T0, T0 + 30 * MIN)  # the scripts are loaded
    store.end_run("warm", "r0", RunStatus.COMPLETED, T0)
    sent = _round_trips(monkeypatch)
    # When a run begins: its status read, its lane taken, then its record and indexes together
    store.begin_run("s", "r1", "main", T0, T0 + 30 * MIN)
    assert len(sent) == 3
    # When it ends: record, lane and indexes, one round trip
    sent.clear()
    assert store.end_run("s", "r1", RunStatus.COMPLETED, T0 + 600)
    assert len(sent) == 1
    assert store.lane("s") is None
    assert store.client.zscore(store.ledger.keys("s", "r1").index.ended, run_member("s", "r1")) == T0 + 600


def test_a_run_begun_again_keeps_its_first_deadline_in_its_index(store: SessionStore) -> None:
    # Given a run begun with one deadline
    store.begin_run("s", "r1", "main", T0, T0 + 30 * MIN)
    # When it is begun again with another (its indexes are entered with it first)
    store.begin_run("s", "r1", "main", T0 + 5, T0 + 90 * MIN)
    # Then its index holds the deadline the run kept
    index = store.ledger.keys("s", "r1").index
    assert store.client.zscore(index.by_deadline, run_member("s", "r1")) == T0 + 30 * MIN


def test_scripts_a_restarted_redis_lost_are_loaded_and_run_again(store: SessionStore) -> None:
    # Given a run begun, then Redis lost every script (a restart, a failover to a fresh replica)
    store.begin_run("s", "r1", "main", T0, T0 + 30 * MIN)
    for node_client in _node_clients(store):
        node_client.script_flush()
    # When the run ends: its three steps are sent together, each script unknown
    assert store.end_run("s", "r1", RunStatus.COMPLETED, T0 + 600)
    # Then each step ran once: ended, lane free, in the ended index
    info = store.run("s", "r1")
    assert info is not None
    assert info.status == "completed"
    assert store.lane("s") is None
    assert store.client.zscore(store.ledger.keys("s", "r1").index.ended, run_member("s", "r1")) == T0 + 600


def _node_clients(store: SessionStore) -> list[Any]:
    client = store.client
    if isinstance(client, RedisCluster):
        return [node.redis_connection for node in client.get_primaries()]
    return [client]
