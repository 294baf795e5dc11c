"""Answers handed on with no replica in sync are kept until one holds them (issue 42).

On a real Sentinel topology (tests/sentinel_harness.py): the primary is SIGKILLed, so the
promoted replica has no replica of its own and is written as a lone Redis. An answer read
there is kept; a failover that lost it gets it written back; a replica that holds it lets it go.
The write-back's rules (``answer_restore.lua``) are checked on one redis-server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from tests.harness import base_env, settings_of, wait_until
from tests.sentinel_harness import LocalSentinels
from workers import ToolCall, ToolResult
from workers.core.results import deadline_result, success_result
from workers.runtime import open_ledger
from workers.store.kept_answers import KeptAnswers, kept_counts
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger


def _ok(call_id: str, text: str) -> ToolResult:
    return success_result(ToolCall(id=call_id, name="echo", arguments={}), text, elapsed_ms=1, attempt=1)


def _keeper(client: redis.Redis) -> KeptAnswers:
    return KeptAnswers(lambda: client, prefix="t", ttl_s=60, interval_s=3600)


@pytest.fixture
def plain(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


def _stored(client: redis.Redis, keys: RunKeys, call_id: str) -> str | None:
    return client.hget(keys.call(call_id), "result")  # type: ignore[return-value]


def test_an_answer_the_ledger_lost_is_written_back(plain: redis.Redis) -> None:
    # Given an answer kept on a primary the Sentinels no longer name, which does not hold it
    keeper, keys = _keeper(plain), RunKeys("t", "s1", "r1")
    keeper.keep(keys, {"c": _ok("c", "real")}, primary=("127.0.0.1", 1))
    # When the keeper settles (the lone redis-server is no Sentinel's: it names None)
    keeper.settle()
    # Then the answer is in the ledger, listed in its run, and counted
    assert _stored(plain, keys, "c") == _ok("c", "real").to_json()
    assert plain.zrange(keys.calls, 0, -1) == ["c"]
    assert kept_counts(plain, "t") == {"restored": 1, "conflict": 0}
    # and a lone Redis holds it on no replica: it stays kept
    assert len(keeper) == 1


def test_an_answer_decided_after_the_delivery_is_replaced(plain: redis.Redis) -> None:
    # Given the watchdog's deadline answer, decided on a ledger that had lost the delivered one
    keeper, keys = _keeper(plain), RunKeys("t", "s1", "r1")
    keeper.keep(keys, {"c": _ok("c", "real")}, primary=("127.0.0.1", 1))
    call = ToolCall(id="c", name="echo", arguments={})
    late = deadline_result(call, submitted_ms=_now_ms() - 20_000, deadline_ms=_now_ms() - 9_000)
    plain.hset(
        keys.call("c"), mapping={"state": "done", "result": late.to_json(), "finished_ms": _now_ms() + 5}
    )
    # When the keeper settles
    keeper.settle()
    # Then the ledger holds what the agent was handed
    assert _stored(plain, keys, "c") == _ok("c", "real").to_json()


def test_an_answer_decided_before_the_delivery_is_never_replaced(plain: redis.Redis) -> None:
    # Given another answer the ledger held before this one was handed on
    keys = RunKeys("t", "s1", "r1")
    earlier = _ok("c", "first").to_json()
    plain.hset(keys.call("c"), mapping={"state": "done", "result": earlier, "finished_ms": _now_ms() - 1000})
    keeper = _keeper(plain)
    keeper.keep(keys, {"c": _ok("c", "second")}, primary=("127.0.0.1", 1))
    # When the keeper settles
    keeper.settle()
    # Then the first writer still wins, and the conflict is counted
    assert _stored(plain, keys, "c") == earlier
    assert kept_counts(plain, "t") == {"restored": 0, "conflict": 1}


def _now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture
def sentinel_ledger(sentinels: LocalSentinels) -> Iterator[Ledger]:
    env = base_env(sentinels.url, UNSTUCK_REDIS__SENTINEL_MASTER=sentinels.master)
    ledger = open_ledger(settings_of(env))
    yield ledger
    ledger.close()


@pytest.mark.timeout(120)
def test_an_answer_read_with_no_replica_is_kept_until_a_replica_holds_it(
    sentinels: LocalSentinels, sentinel_ledger: Ledger
) -> None:
    ledger, kept = sentinel_ledger, sentinel_ledger.kept
    assert kept is not None
    keys = ledger.keys("s1", "r1")
    # Given the promoted replica of a dead primary: it has no replica of its own
    sentinels.kill_primary()
    sentinels.await_promotion()
    wait_until(lambda: _written(ledger, keys), timeout_s=30, what="a write on the promoted replica")
    # When an answer is read there (handed on)
    assert ledger.results(keys, ["c"]) == {"c": _ok("c", "real")}
    # Then it is kept, and stays kept while no replica holds it
    assert len(kept) == 1
    assert kept.settle() == 1
    # and once the old primary is back as a replica in sync, it is let go
    sentinels.primary.stop()
    sentinels.primary.start(timeout_s=30)
    wait_until(sentinels.settled, timeout_s=60, interval_s=0.2, what="the old primary in sync as a replica")
    # A fence waits 100 ms for the replica's ack and the keeper asks again on its next tick: on
    # a loaded machine the first ask can miss it (CI, stop 49), so await the drop, as the keeper does.
    wait_until(lambda: kept.settle() == 0, timeout_s=15, interval_s=0.2, what="the kept answer let go")


def _written(ledger: Ledger, keys: RunKeys) -> bool:
    try:
        ledger.finish(keys, _ok("c", "real"), now_ms=_now_ms(), writer="w")
    except Exception:  # noqa: BLE001 - the promotion may still be under way: try again
        return False
    return True


def test_an_open_call_written_back_leaves_the_run_summary_and_the_due_index(plain: redis.Redis) -> None:
    # Given a call whose registration and claim survived the failover but not its answer
    keeper, keys = _keeper(plain), RunKeys("t", "s1", "r1")
    plain.hset(
        keys.call("c"),
        mapping={"call_id": "c", "state": "running", "counted": "1", "deadline_ms": _now_ms() + 9_000},
    )
    plain.hset(keys.run, mapping={"open_n": 1, "claimed_n": 1, "progress_ms": 1})
    plain.zadd(keys.index.due, {keys.due_member("c"): _now_ms() + 9_000})
    keeper.keep(keys, {"c": _ok("c", "real")}, primary=("127.0.0.1", 1))
    # When the keeper writes it back
    keeper.settle()
    # Then the run counts it answered, as a finish would, and the sweep no longer looks at it
    assert plain.hmget(keys.run, ["open_n", "claimed_n"]) == ["0", "0"]
    assert plain.zscore(keys.index.due, keys.due_member("c")) is None
    assert _stored(plain, keys, "c") == _ok("c", "real").to_json()


def test_a_process_keeps_a_bounded_number_of_answers(
    plain: redis.Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from workers.store import kept_answers

    monkeypatch.setattr(kept_answers, "_MOST_KEPT", 3)
    keeper, keys = _keeper(plain), RunKeys("t", "s1", "r1")
    for n in range(5):
        keeper.keep(keys, {f"c{n}": _ok(f"c{n}", "x")}, primary=("127.0.0.1", 1))
    assert len(keeper) == 3
    assert "the oldest are no longer kept" in caplog.text
    keeper.settle()  # the newest three are what it writes back
    assert sorted(plain.zrange(keys.calls, 0, -1)) == ["c2", "c3", "c4"]
