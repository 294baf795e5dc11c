"""The Redis loop history gives the same verdicts as memory, and every key it writes expires."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from workers.core.loops import HistoryEntry, InMemoryLoopHistory, RunScope, compare_expectations, replay
from workers.core.loops.history import WARNING_KEY_LIMIT
from workers.store.keys import RunKeys
from workers.store.loop_history import RedisLoopHistory

FIXTURES = sorted((Path(__file__).parents[2] / "fixtures" / "loops").glob("*.json"))
SCOPE = RunScope("sess", "run-1")


def _store(client: redis.Redis) -> RedisLoopHistory:
    return RedisLoopHistory(client, prefix="t", ttl_s=300)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fixture_replays_as_expected_through_redis(path: Path, loop_redis: redis.Redis) -> None:
    # Given
    case = json.loads(path.read_text())
    store = _store(loop_redis)
    # When
    verdicts = replay(case, lambda: store, session_key="s-" + path.stem)
    # Then
    assert compare_expectations(verdicts, case["expect"]) == []
    assert verdicts == replay(case, InMemoryLoopHistory)
    for key in loop_redis.keys("*"):
        assert loop_redis.ttl(key) > 0, key


def test_every_key_kind_has_a_ttl(loop_redis: redis.Redis) -> None:
    # Given a store that writes history, guard state and warning buckets
    store = _store(loop_redis)
    entry = HistoryEntry(0, "read", "read:a", "c1", "run-1")
    # When
    store.record_call(SCOPE, entry, 5, now_ms=1)
    store.arm_guard(SCOPE, 3, now_ms=2)
    store.record_outcome(
        SCOPE, HistoryEntry(0, "read", "read:a", "c1", result_hash="h"), 5, ("read", "read:a", "h"), 3
    )
    store.note_warning(SCOPE, "k", 1, now_ms=4)
    # Then
    keys = RunKeys("t", "sess", "run-1")
    assert sorted(k.decode() if isinstance(k, bytes) else k for k in loop_redis.keys("*")) == sorted(
        [keys.history, keys.loop_state, keys.run]
    )
    for key in (keys.history, keys.loop_state, keys.run):
        assert loop_redis.ttl(key) > 0


def test_run_hash_ttl_is_only_extended(loop_redis: redis.Redis) -> None:
    keys = RunKeys("t", "sess", "run-1")
    loop_redis.hset(keys.run, "status", "running")
    loop_redis.expire(keys.run, 10_000)
    _store(loop_redis).arm_guard(SCOPE, 3, now_ms=1)
    assert loop_redis.ttl(keys.run) > 300


def test_a_check_refreshes_the_ttls_only_a_tenth_of_a_ttl_after_the_last_refresh(
    loop_redis: redis.Redis,
) -> None:
    # Given a run whose first check set both keys' TTLs (300 s), which then ran down
    store, keys = _store(loop_redis), RunKeys("t", "sess", "run-1")
    entry = HistoryEntry(0, "read", "read:a", "c1")
    store.check_call(SCOPE, entry, 5, 20, now_ms=1_000)
    for key in (keys.history, keys.loop_state):
        loop_redis.expire(key, 100)

    def ttls() -> list[int]:
        return [loop_redis.ttl(keys.history), loop_redis.ttl(keys.loop_state)]

    # When checks come within a tenth of the TTL (30 s) of that refresh: untouched
    store.check_call(SCOPE, entry, 5, 20, now_ms=1_000 + 29_999)
    assert max(ttls()) <= 100
    # ... from a clock 30 s ahead or behind: refreshed
    store.check_call(SCOPE, entry, 5, 20, now_ms=31_000)
    assert min(ttls()) > 290
    for key in (keys.history, keys.loop_state):
        loop_redis.expire(key, 100)
    store.check_call(SCOPE, entry, 5, 20, now_ms=1_000)
    assert min(ttls()) > 290
    # ... and a history that expired ahead of its state gets its TTL at once
    loop_redis.delete(keys.history)
    store.check_call(SCOPE, entry, 5, 20, now_ms=1_001)
    assert loop_redis.ttl(keys.history) > 290


def test_history_is_trimmed_and_blocked_calls_leave_no_trace(loop_redis: redis.Redis) -> None:
    store = _store(loop_redis)
    for n in range(6):
        window, seq = store.record_call(SCOPE, HistoryEntry(0, "read", f"read:{n}"), 3, now_ms=n)
    assert [e.args_hash for e in window] == ["read:2", "read:3", "read:4"]
    assert loop_redis.zcard(RunKeys("t", "sess", "run-1").history) == 4
    store.discard_call(SCOPE, seq)
    again, _ = store.record_call(SCOPE, HistoryEntry(0, "read", "read:x"), 3, now_ms=9)
    assert again == window


def test_guard_window_round_trip_and_disarm(loop_redis: redis.Redis) -> None:
    store = _store(loop_redis)
    triple = ("gateway", "gateway:a", "r")
    entry = HistoryEntry(0, *triple[:2], result_hash=triple[2])
    assert store.record_outcome(SCOPE, entry, None, triple, now_ms=1) is None
    store.arm_guard(SCOPE, 2, now_ms=2)
    assert store.record_outcome(SCOPE, entry, None, triple, now_ms=3) == (triple,)
    store.disarm_guard(SCOPE)
    assert store.record_outcome(SCOPE, entry, None, triple, now_ms=4) is None


def test_warning_dedup_matches_memory_including_eviction(loop_redis: redis.Redis) -> None:
    # Given the same sequence of warnings on both stores
    store, memory = _store(loop_redis), InMemoryLoopHistory()
    sequence = (
        [("k", 1), ("k", 1), ("k", 2)]
        + [(f"key{n}", 1) for n in range(WARNING_KEY_LIMIT)]
        + [("k", 2), ("key5", 1)]
    )
    # When / Then
    got = [store.note_warning(SCOPE, key, bucket, 0) for key, bucket in sequence]
    assert got == [memory.note_warning(SCOPE, key, bucket, 0) for key, bucket in sequence]
    assert got[-2:] == [True, False]


def test_cli_replays_through_redis_and_deletes_its_keys(loop_redis: redis.Redis, loop_redis_url: str) -> None:
    # Given
    fixture = next(p for p in FIXTURES if p.stem == "generic_repeat_identical_outcomes")
    # When
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.cli.main",
            "loops",
            "replay",
            str(fixture),
            "--store",
            "redis",
            "--redis-url",
            loop_redis_url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Then
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == replay(json.loads(fixture.read_text()), InMemoryLoopHistory)
    assert loop_redis.dbsize() == 0


def test_a_server_that_lost_its_scripts_is_given_them_again(loop_redis: redis.Redis) -> None:
    # Given a store whose scripts were loaded, then flushed (as a Redis restart loses them)
    store = _store(loop_redis)
    store.record_call(SCOPE, HistoryEntry(0, "read", "read:1", "c1"), 3, now_ms=1)
    loop_redis.script_flush()
    # When the next check, outcome and discard run
    signals, seq = store.check_call(SCOPE, HistoryEntry(0, "read", "read:1", "c2"), 3, 20, now_ms=2)
    store.record_outcome(SCOPE, HistoryEntry(0, "read", "read:1", "c1", result_hash="h"), 3, None, now_ms=3)
    store.discard_call(SCOPE, seq)
    # Then each loaded its script again and did its work
    assert signals.recent == 1  # the record of c1, read through the reloaded script
    assert loop_redis.zcard(RunKeys("t", "sess", "run-1").history) == 1
