"""What the sweep relies on to cost O(due): run progress raised by the ledger, a lease index.

Both sweep paths (server-side scripts and the pipelined, cluster-safe one) run every test.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import CLUSTER_LEG, store_client
from workers.core.models import SyntheticReason, ToolCall, ToolResult
from workers.core.reaping import ActionKind, Reap
from workers.core.results import synthetic_result
from workers.settings import Settings
from workers.store.claims import ClaimCounter
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger
from workers.store.sessions import SessionStore
from workers.watchdog.alerts import AlertSink
from workers.watchdog.sweep import Watchdog

T0 = int(time.time() * 1000)
MIN = 60_000
LEASE_MS = 3000
# The scripts path reads many slots in one script: a single node's only (a cluster refuses it).
SWEEP_PATHS: dict[str, Any] = (
    {"argvalues": [False], "ids": ["pipelined"]}
    if CLUSTER_LEG
    else {"argvalues": [True, False], "ids": ["scripts", "pipelined"]}
)


@pytest.fixture
def store(redis_url: str) -> Iterator[SessionStore]:
    client = store_client(redis_url)
    yield SessionStore(Ledger(client, prefix="a", ttl_s=3600, lease_ttl_ms=LEASE_MS))
    client.close()


def _register(store: SessionStore, keys: RunKeys, call_id: str, *, now_ms: int, deadline_ms: int) -> None:
    fields = {"tool": "echo", "dispatched": "1", "job_digest": "d"}
    store.ledger.register(keys, call_id, now_ms=now_ms, deadline_ms=deadline_ms, fields=fields)


def _answer(store: SessionStore, keys: RunKeys, call_id: str, now_ms: int) -> None:
    result = synthetic_result(
        ToolCall(id=call_id, name="echo"), SyntheticReason.CANCELLED, elapsed_ms=1, attempt=1
    )
    store.ledger.finish(keys, result, now_ms=now_ms, writer="w")


def _progress(store: SessionStore, keys: RunKeys) -> int:
    return int(store.client.hget(keys.run, "progress_ms") or 0)


def _sweep(store: SessionStore, now_ms: int, *, server_side: bool, limit: int = 10_000) -> int:
    lease = {"ttl_s": LEASE_MS / 1000, "renew_interval_s": 1.0}
    settings = Settings(watchdog={"stalled_after_s": 120}, lease=lease)
    alerts = AlertSink()
    watchdog = Watchdog(store, settings, writer="wd", alerts=alerts, server_side=server_side, limit=limit)
    return watchdog.sweep(now_ms).calls_answered


def test_every_call_event_raises_run_progress_and_never_lowers_it(store: SessionStore) -> None:
    # Given a running run
    store.begin_run("s", "r1", "main", T0, T0 + 60 * MIN)
    keys, led = store.ledger.keys("s", "r1"), store.ledger
    # When its call is registered, claimed (counted by the lease keeper: a claim does not touch
    # its run), heartbeats and finishes
    _register(store, keys, "c1", now_ms=T0 + 10, deadline_ms=T0 + 30 * MIN)
    after_register = _progress(store, keys)
    led.claim(keys, "c1", worker_id="w:1", now_ms=T0 + 15, tool="echo", job_digest="d")
    assert _progress(store, keys) == after_register
    ClaimCounter(store.client).count(keys, "c1", now_ms=T0 + 20)
    after_claim = _progress(store, keys)
    led.heartbeat(keys, "c1", now_ms=T0 + 30, details={"step": 1})
    after_beat = _progress(store, keys)
    led.heartbeat(keys, "c1", now_ms=T0 + 25, details={"step": 2})  # a worker with a slower clock
    _answer(store, keys, "c1", T0 + 40)
    # Then each step moved progress forward, the late clock did not move it back
    steps = (after_register, after_claim, after_beat, _progress(store, keys))
    assert steps == (T0 + 10, T0 + 20, T0 + 30, T0 + 40)


def test_call_activity_never_creates_a_run_record_or_a_call_record(store: SessionStore) -> None:
    # Given a call whose run has no record (a call outside a run)
    keys = store.ledger.keys("s", "norun")
    _register(store, keys, "c1", now_ms=T0, deadline_ms=T0 + MIN)
    store.ledger.claim(keys, "c1", worker_id="w:1", now_ms=T0 + 1, tool="echo", job_digest="d")
    # When it heartbeats, and a heartbeat arrives for a call whose record expired
    store.ledger.heartbeat(keys, "c1", now_ms=T0 + 2, details={})
    store.ledger.heartbeat(keys, "gone", now_ms=T0 + 3, details={})
    # Then neither record was made up
    assert not store.client.exists(keys.run)
    assert not store.client.exists(keys.call("gone"))
    assert store.client.hget(keys.call("c1"), "hb_ms") == str(T0 + 2)


def test_lease_index_follows_claim_renewal_and_finish(store: SessionStore) -> None:
    # Given a claimed call
    keys, led = store.ledger.keys("s", "r1"), store.ledger
    _register(store, keys, "c1", now_ms=T0, deadline_ms=T0 + MIN)
    member, index = keys.due_member("c1"), keys.index.leases
    led.claim(keys, "c1", worker_id="w:1", now_ms=T0, tool="echo", job_digest="d")
    claimed = store.client.zscore(index, member)
    # When the worker renews later, and once more with an older clock
    led.renew_leases([(keys, "c1")], "w:1", now_ms=T0 + 1000)
    renewed = store.client.zscore(index, member)
    led.renew_leases([(keys, "c1")], "w:1", now_ms=T0 + 500)
    # Then the score is the lease's end, never moved back
    assert (claimed, renewed, store.client.zscore(index, member)) == (T0 + LEASE_MS, T0 + 1000 + LEASE_MS,
                                                                      T0 + 1000 + LEASE_MS)  # fmt: skip
    # When it finishes and a renewal races in afterwards
    _answer(store, keys, "c1", T0 + 2000)
    led.renew_leases([(keys, "c1")], "w:1", now_ms=T0 + 2500)
    # Then neither index holds it, and its lease, left to run out (the answer does not delete
    # it: readers read the call's state first), lasts no longer than one lease from now
    assert store.client.zscore(index, member) is None
    assert store.client.zscore(keys.index.due, member) is None
    assert store.client.hget(keys.call("c1"), "state") == "done"
    assert 0 < store.client.pttl(keys.lease("c1")) <= LEASE_MS


def _cancelled(call_id: str) -> ToolResult:
    call = ToolCall(id=call_id, name="echo")
    return synthetic_result(call, SyntheticReason.CANCELLED, elapsed_ms=1, attempt=1)


def test_a_call_claimed_and_answered_soon_after_submission_never_touches_the_lease_index(
    store: SessionStore,
) -> None:
    # Given a call registered at T0: due for the sweep's first look one lease later
    keys, led = store.ledger.keys("s", "r1"), store.ledger
    _register(store, keys, "c1", now_ms=T0, deadline_ms=T0 + MIN)
    member = keys.due_member("c1")
    assert store.client.zscore(keys.index.due, member) == T0 + LEASE_MS
    # When a worker claims it at once (its message says when it was submitted)
    led.claim(keys, "c1", worker_id="w:1", now_ms=T0 + 5, tool="echo", job_digest="d", submitted_ms=T0)
    # Then no lease-index entry was written
    assert store.client.zscore(keys.index.leases, member) is None
    # When a stray entry is there anyway and the worker answers soon, giving the submission time
    store.client.zadd(keys.index.leases, {member: T0 + 1})
    assert led.finish(keys, _cancelled("c1"), now_ms=T0 + 10, writer="w:1", submitted_ms=T0)
    # Then the answer sent no removal for it (the sweep drops such a stray), and left the due index
    assert store.client.zscore(keys.index.leases, member) == T0 + 1
    assert store.client.zscore(keys.index.due, member) is None


def test_a_claim_or_answer_past_half_a_lease_writes_and_removes_the_lease_index(store: SessionStore) -> None:
    # Given a call that waited in the queue for half a lease
    keys, led = store.ledger.keys("s", "r1"), store.ledger
    _register(store, keys, "c1", now_ms=T0, deadline_ms=T0 + MIN)
    member, late = keys.due_member("c1"), T0 + LEASE_MS // 2
    # When a worker claims it then
    led.claim(keys, "c1", worker_id="w:1", now_ms=late, tool="echo", job_digest="d", submitted_ms=T0)
    # Then its lease is indexed by its end; and the answer removes it
    assert store.client.zscore(keys.index.leases, member) == late + LEASE_MS
    assert led.finish(keys, _cancelled("c1"), now_ms=late + 1, writer="w:1", submitted_ms=T0)
    assert store.client.zscore(keys.index.leases, member) is None


@pytest.mark.parametrize("server_side", **SWEEP_PATHS)
def test_the_first_look_indexes_a_running_calls_lease_and_finds_a_lost_one(
    store: SessionStore, server_side: bool
) -> None:
    # Given two calls claimed at once (no lease-index entry), one of whose worker hosts vanished
    keys, led = store.ledger.keys("s", "r1"), store.ledger
    for call_id in ("live", "lost"):
        _register(store, keys, call_id, now_ms=T0, deadline_ms=T0 + 50 * MIN)
        led.claim(keys, call_id, worker_id="w:1", now_ms=T0 + 1, tool="echo", job_digest="d", submitted_ms=T0)
    store.client.delete(keys.lease("lost"))
    # When the sweep makes its first look, one lease after submission
    now = T0 + LEASE_MS + 1
    answered = _sweep(store, now, server_side=server_side)
    # Then the lost call was answered worker_lost; the live one is in the lease index by its
    # lease's real end and due again only at its deadline
    assert answered == 1
    assert led.results(keys, ["lost"])["lost"].reason == SyntheticReason.WORKER_LOST.value
    member = keys.due_member("live")
    lease_end = store.client.zscore(keys.index.leases, member)
    assert lease_end is not None
    assert now < lease_end <= now + LEASE_MS
    assert store.client.zscore(keys.index.due, member) == T0 + 50 * MIN


@pytest.mark.parametrize("server_side", **SWEEP_PATHS)
def test_a_queued_call_at_its_first_look_waits_for_its_deadline_and_a_late_claim_indexes_it(
    store: SessionStore, server_side: bool
) -> None:
    # Given a call still queued (dispatched, unclaimed) at its first look
    keys, led = store.ledger.keys("s", "r1"), store.ledger
    _register(store, keys, "c1", now_ms=T0, deadline_ms=T0 + 50 * MIN)
    member, now = keys.due_member("c1"), T0 + LEASE_MS + 1
    assert _sweep(store, now, server_side=server_side) == 0
    # Then it is due at its deadline, outside the lease index
    assert store.client.zscore(keys.index.due, member) == T0 + 50 * MIN
    assert store.client.zscore(keys.index.leases, member) is None
    # When a worker claims it now, then its lease is indexed (a lost worker is found by it)
    led.claim(keys, "c1", worker_id="w:1", now_ms=now + 1, tool="echo", job_digest="d", submitted_ms=T0)
    assert store.client.zscore(keys.index.leases, member) == now + 1 + LEASE_MS


@pytest.mark.parametrize("server_side", **SWEEP_PATHS)
def test_a_lost_call_is_found_past_the_sweep_limit(store: SessionStore, server_side: bool) -> None:
    # Given more live calls with earlier deadlines than one sweep reads, and one lost call
    keys, led = store.ledger.keys("s", "r1"), store.ledger
    for n in range(8):
        _register(store, keys, f"live{n}", now_ms=T0, deadline_ms=T0 + MIN + n)
        led.claim(keys, f"live{n}", worker_id="w:1", now_ms=T0, tool="echo", job_digest="d")
    _register(store, keys, "lost", now_ms=T0, deadline_ms=T0 + 50 * MIN)
    led.claim(keys, "lost", worker_id="w:2", now_ms=T0, tool="echo", job_digest="d")
    store.client.delete(keys.lease("lost"))  # its worker host vanished
    # When sweeps reading 5 candidates each run after the leases' recorded end
    now = T0 + LEASE_MS + 1
    answered = [_sweep(store, now, server_side=server_side, limit=5) for _ in range(2)]
    # Then the live calls were re-scored to their real lease end, which let the second find the lost one
    assert answered == [0, 1]
    reason = led.results(keys, ["lost"])["lost"].reason
    assert reason == SyntheticReason.WORKER_LOST.value
    scores = [store.client.zscore(keys.index.leases, keys.due_member(f"live{n}")) for n in range(8)]
    assert all(score is not None and score > now for score in scores)


@pytest.mark.parametrize("server_side", **SWEEP_PATHS)
def test_sweep_cleans_members_of_answered_and_queued_calls(store: SessionStore, server_side: bool) -> None:
    # Given an answered call whose index members survived a crash, a queued call in the lease index
    keys = store.ledger.keys("s", "r1")
    for call_id in ("answered", "queued"):
        _register(store, keys, call_id, now_ms=T0, deadline_ms=T0 + 10)
    _answer(store, keys, "answered", T0 + 1)
    store.client.zadd(keys.index.due, {keys.due_member("answered"): T0 + 10})
    store.client.zadd(keys.index.leases, {keys.due_member("answered"): T0, keys.due_member("queued"): T0})
    store.client.hset(keys.call("queued"), "deadline_ms", T0 + 50 * MIN)
    # When
    _sweep(store, T0 + 20, server_side=server_side)
    # Then the answered call left both indexes, the queued one left the lease index only
    assert store.client.zrange(keys.index.leases, 0, -1) == []
    assert store.client.zrange(keys.index.due, 0, -1) == [keys.due_member("queued")]


def test_run_summary_counts_open_and_claimed_calls_through_every_change(store: SessionStore) -> None:
    # Given a running run
    store.begin_run("s", "r1", "main", T0, T0 + 60 * MIN)
    keys, led = store.ledger.keys("s", "r1"), store.ledger

    def counts() -> tuple[int, int]:
        info = store.run("s", "r1")
        assert info is not None
        return info.open_calls, info.claimed_calls

    counter = ClaimCounter(store.client)
    seen = []
    # When two calls are registered (one twice), one claimed (and counted by a lease keeper), lost
    # and handed back, claimed again, then lost and taken over
    for call_id in ("a", "b", "a"):
        _register(store, keys, call_id, now_ms=T0, deadline_ms=T0 + MIN)
    seen.append(counts())
    led.claim(keys, "a", worker_id="w:1", now_ms=T0 + 1, tool="echo", job_digest="d")
    seen.append(counts())
    assert counter.count(keys, "a", now_ms=T0 + 1)
    assert not counter.count(keys, "a", now_ms=T0 + 1)  # once
    seen.append(counts())
    store.client.delete(keys.lease("a"))
    lost = next(call for call in led.open_calls(keys, ["a"]) if call.call_id == "a")
    assert led.reap(keys, [Reap(lost, ActionKind.REQUEUE)], now_ms=T0 + 2, writer="gw") == (0, ["a"])
    seen.append(counts())
    led.claim(keys, "a", worker_id="w:2", now_ms=T0 + 2, tool="echo", job_digest="d")
    led.claim(
        keys, "a", worker_id="w:3", now_ms=T0 + 3, tool="echo", job_digest="d"
    )  # busy: the lease is held
    store.client.delete(keys.lease("a"))
    led.claim(
        keys, "a", worker_id="w:4", now_ms=T0 + 3, tool="echo", job_digest="d"
    )  # taken over without a hand-back
    assert counter.count(keys, "a", now_ms=T0 + 3)
    assert counter.count(keys, "b", now_ms=T0 + 3) is False  # not running: nothing to count
    seen.append(counts())
    # When it is answered twice (the second kept as late), then the queued one is answered
    _answer(store, keys, "a", T0 + 4)
    _answer(store, keys, "a", T0 + 5)
    seen.append(counts())
    _answer(store, keys, "b", T0 + 6)
    seen.append(counts())
    # Then (open, claimed) followed each change exactly once
    assert seen == [(2, 0), (2, 0), (2, 1), (2, 0), (2, 1), (1, 0), (0, 0)]


def test_a_claim_answered_before_it_was_counted_leaves_the_summary_as_it_was(store: SessionStore) -> None:
    # Given a claimed call no lease keeper counted yet (answered within one tick: most calls)
    store.begin_run("s", "r1", "main", T0, T0 + 60 * MIN)
    keys, led = store.ledger.keys("s", "r1"), store.ledger
    _register(store, keys, "a", now_ms=T0, deadline_ms=T0 + MIN)
    led.claim(keys, "a", worker_id="w:1", now_ms=T0 + 1, tool="echo", job_digest="d")
    # When it is answered, and a keeper's late count comes after
    _answer(store, keys, "a", T0 + 2)
    assert not ClaimCounter(store.client).count(keys, "a", now_ms=T0 + 3)
    # Then nothing was counted, nothing taken back
    info = store.run("s", "r1")
    assert info is not None
    assert (info.open_calls, info.claimed_calls) == (0, 0)
