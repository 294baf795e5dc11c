"""The ledger's TTL rule (workers/store/keys.py, (*) and (**)), with as few EXPIREs as it takes.

Every key outlives ledger.ttl_s after its last write.

Each "skips" test lowers a key's TTL by hand, so a script that still EXPIREs it is seen.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.harness import store_client
from workers.answering.service import Answers
from workers.core.models import SyntheticReason, ToolCall
from workers.core.results import synthetic_result
from workers.core.run_health import RunStatus
from workers.store.keys import RunKeys
from workers.store.ledger import KEYS_REFRESH_S, Ledger, Signal
from workers.store.sessions import RECENT_CALLS, RunAbort, SessionStore, mark_run_aborted

T0 = int(time.time() * 1000)
MIN = 60_000
TTL_S = 3600
LOW_MS = 5_000  # a TTL set by hand, far below any the scripts set


@pytest.fixture
def store(redis_url: str) -> Iterator[SessionStore]:
    client = store_client(redis_url)
    yield SessionStore(Ledger(client, prefix="t", ttl_s=TTL_S, lease_ttl_ms=3000))
    client.close()


def _run(store: SessionStore, run_id: str = "r1") -> RunKeys:
    store.begin_run("s", run_id, "main", T0, T0 + 30 * MIN)
    return store.ledger.keys("s", run_id)


def _register(store: SessionStore, keys: RunKeys, call_id: str, *, now_ms: int, deadline_ms: int) -> None:
    fields = {"tool": "echo", "dispatched": "1", "job_digest": "d"}
    assert store.ledger.register(keys, call_id, now_ms=now_ms, deadline_ms=deadline_ms, fields=fields)


def _answer(store: SessionStore, keys: RunKeys, call_id: str, now_ms: int) -> None:
    call = ToolCall(id=call_id, name="echo")
    result = synthetic_result(call, SyntheticReason.CANCELLED, elapsed_ms=1, attempt=1)
    assert store.ledger.finish(keys, result, now_ms=now_ms, writer="w")


def test_a_call_record_lives_ledger_ttl_past_its_deadline_without_claim_or_finish_extending_it(
    store: SessionStore,
) -> None:
    # Given a call registered with a deadline ten minutes out
    keys = _run(store)
    _register(store, keys, "c1", now_ms=T0, deadline_ms=T0 + 10 * MIN)
    # Then its record outlives the deadline by ledger.ttl_s
    assert store.client.ttl(keys.call("c1")) >= TTL_S + 10 * 60
    # When its TTL is lowered by hand, and it is claimed and answered before its deadline
    store.client.pexpire(keys.call("c1"), LOW_MS)
    store.ledger.claim(keys, "c1", worker_id="w:1", now_ms=T0 + 1, tool="echo", job_digest="d")
    _answer(store, keys, "c1", T0 + 2)
    # Then neither touched the TTL
    assert 0 < store.client.pttl(keys.call("c1")) <= LOW_MS


def test_an_answer_stored_for_a_call_never_registered_is_listed_in_its_run(store: SessionStore) -> None:
    # Given a run with one registered call, and one whose registration never reached Redis
    keys = _run(store)
    _register(store, keys, "c1", now_ms=T0, deadline_ms=T0 + MIN)
    # When the gateway stores its answer for the unregistered one (Redis is back)
    _answer(store, keys, "c2", T0 + 5)
    # Then the run lists both, in the order they entered the ledger, and the list keeps its TTL
    assert store.ledger.run_call_ids(keys) == ["c1", "c2"]
    assert store.client.ttl(keys.calls) > 0
    # And a second answer changes nothing (kept as late)
    late = synthetic_result(
        ToolCall(id="c2", name="echo"), SyntheticReason.CANCELLED, elapsed_ms=2, attempt=1
    )
    assert not store.ledger.finish(keys, late, now_ms=T0 + 6, writer="w2")
    assert store.ledger.run_call_ids(keys) == ["c1", "c2"]


def test_an_answer_past_the_deadline_keeps_the_record_ledger_ttl_longer(store: SessionStore) -> None:
    keys = _run(store)
    _register(store, keys, "c1", now_ms=T0, deadline_ms=T0 + MIN)
    store.client.pexpire(keys.call("c1"), LOW_MS)
    # When it is answered after its deadline
    _answer(store, keys, "c1", T0 + 2 * MIN)
    # Then the record lives ledger.ttl_s from the answer
    assert store.client.ttl(keys.call("c1")) > TTL_S - 5


def test_the_runs_keys_get_their_ttl_at_most_once_a_refresh_interval(store: SessionStore) -> None:
    # Given a run whose first call set the TTL of its calls key, lowered by hand
    keys = _run(store)
    _register(store, keys, "c1", now_ms=T0, deadline_ms=T0 + MIN)
    assert store.client.ttl(keys.calls) > TTL_S
    store.client.pexpire(keys.calls, LOW_MS)
    # When another call registers within the interval
    _register(store, keys, "c2", now_ms=T0 + 1000, deadline_ms=T0 + MIN)
    # Then the TTL was not set again
    assert 0 < store.client.pttl(keys.calls) <= LOW_MS
    # When one registers an interval later
    _register(store, keys, "c3", now_ms=T0 + KEYS_REFRESH_S * 1000 + 1, deadline_ms=T0 + 2 * MIN)
    # Then it is set again
    assert store.client.ttl(keys.calls) > TTL_S


def test_done_gets_no_ttl_while_its_run_runs_and_one_when_the_run_ends(store: SessionStore) -> None:
    # Given a running run with three calls
    keys = _run(store)
    for n in range(3):
        _register(store, keys, f"c{n}", now_ms=T0, deadline_ms=T0 + 5 * MIN)
    # When an answer creates the wake-up list
    _answer(store, keys, "c0", T0 + 1)
    # Then no TTL is set on the hot path: the run's waiters empty it on every wake-up
    assert store.client.ttl(keys.done) == -1
    # When the run ends
    assert store.end_run("s", "r1", RunStatus.COMPLETED, T0 + 2)
    # Then what is left in it expires
    assert store.client.ttl(keys.done) > TTL_S
    # And an answer pushed onto the ended run, into a list that emptied, gives it a TTL again
    store.client.delete(keys.done)
    _answer(store, keys, "c1", T0 + 3)
    assert store.client.ttl(keys.done) > TTL_S


def test_done_gets_its_ttl_when_the_watchdog_drops_a_run_whose_record_is_gone(store: SessionStore) -> None:
    # Given a running run's answer waiting in its done list (no TTL), and the run record gone
    keys = _run(store)
    _register(store, keys, "c1", now_ms=T0, deadline_ms=T0 + MIN)
    _answer(store, keys, "c1", T0 + 1)
    store.client.delete(keys.run)
    # When the watchdog drops the run's stale index members
    store.drop_stale("s", "r1", T0 + 2)
    # Then the list expires
    assert store.client.ttl(keys.done) > TTL_S


def test_a_loop_abort_gives_the_done_list_its_ttl(store: SessionStore) -> None:
    keys = _run(store)
    _register(store, keys, "c1", now_ms=T0, deadline_ms=T0 + MIN)
    _answer(store, keys, "c1", T0 + 1)
    mark_run_aborted(store.ledger, keys, RunAbort("repeat", 3, "m"), now_ms=T0 + 2)
    assert store.client.ttl(keys.done) > TTL_S


def test_the_run_summary_counts_open_calls_without_a_set_of_them(store: SessionStore) -> None:
    # Given a run with two calls, one answered, one claimed and answered twice
    keys = _run(store)
    _register(store, keys, "c1", now_ms=T0, deadline_ms=T0 + MIN)
    _register(store, keys, "c2", now_ms=T0, deadline_ms=T0 + MIN)
    assert store.client.hget(keys.run, "open_n") == "2"
    _answer(store, keys, "c1", T0 + 1)
    store.ledger.claim(keys, "c2", worker_id="w:1", now_ms=T0 + 2, tool="echo", job_digest="d")
    _answer(store, keys, "c2", T0 + 3)
    call = ToolCall(id="c2", name="echo")
    late = synthetic_result(call, SyntheticReason.CANCELLED, elapsed_ms=1, attempt=2)
    assert not store.ledger.finish(keys, late, now_ms=T0 + 4, writer="w")  # late: audit only
    # Then each answer counted once, and the run keeps no other key of open calls
    assert [int(n or 0) for n in store.client.hmget(keys.run, ["open_n", "claimed_n"])] == [0, 0]
    assert not store.client.exists(f"t:{keys.tag}:open")


def test_ending_a_run_answers_its_open_calls_only(store: SessionStore) -> None:
    keys = _run(store)
    _register(store, keys, "c1", now_ms=T0, deadline_ms=T0 + MIN)
    _register(store, keys, "c2", now_ms=T0, deadline_ms=T0 + MIN)
    _answer(store, keys, "c2", T0 + 1)
    answers = Answers(writer="w", fallbacks={})
    answered = answers.end_run(keys, SyntheticReason.CANCELLED, now_ms=T0 + 2, detail=" (test)").on(
        store.ledger
    )
    assert [call_id for call_id, _ in answered] == ["c1"]


def test_a_handed_back_signal_that_recreates_done_gives_it_a_ttl(store: SessionStore) -> None:
    # Given a run with one signal, for a call another waiter waits for
    keys = _run(store)
    _register(store, keys, "theirs", now_ms=T0, deadline_ms=T0 + MIN)
    _answer(store, keys, "theirs", T0 + 1)
    # When a waiter for another call pops it (emptying the list) and hands it back
    assert store.ledger.wait_for_results(keys, 1.0, mine={"mine"}) is not None
    # Then the list exists again, with a TTL
    [handed] = store.client.lrange(keys.done, 0, -1)
    signal = Signal.parse(str(handed))
    assert (signal.call_id, signal.handed_back) == ("theirs", True)
    assert store.client.ttl(keys.done) > TTL_S


def test_activity_finds_open_calls_older_than_the_recent_ones(store: SessionStore) -> None:
    # Given a run whose first call hangs while a batch wider than the recent window completes
    keys = _run(store)
    _register(store, keys, "old", now_ms=T0, deadline_ms=T0 + MIN)
    for n in range(RECENT_CALLS + 5):
        _register(store, keys, f"c{n}", now_ms=T0 + 1 + n, deadline_ms=T0 + MIN)
        if n != 3:
            _answer(store, keys, f"c{n}", T0 + 100 + n)
    # When its activity is read
    calls = store.activity([("s", "r1")])[("s", "r1")]
    # Then the recent calls are there, and every open call, however old
    assert len(calls) == RECENT_CALLS + 2  # c3 and old are both older than the recent window
    assert sorted(call.call_id for call in calls if call.open) == ["c3", "old"]
