"""The Redis loop scripts keep the detector's signals equal to the reference computed from the window.

``signals_of`` (what the in-memory store returns) is the reference; the Redis store keeps
counts and streaks incrementally (lib_loop_state.lua). Random runs of checks, outcomes in
and out of order, unmatched outcomes, discards (of the newest record, and of older ones)
and history-size changes must give the same signals at every check.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import redis

from workers.core.loops import HistoryEntry, InMemoryLoopHistory, RunScope
from workers.store.keys import RunKeys
from workers.store.loop_history import RedisLoopHistory
from workers.store.lua import LOOP_STATE_LIBRARY, script_text

TOOLS = ("a", "b")
ARGS = ("x", "y", "z")


@dataclass
class Twin:
    """The same run on both stores; a call's seq differs between them after a discard."""

    memory: InMemoryLoopHistory
    redis: RedisLoopHistory
    scope: RunScope
    pending: list[tuple[str, str, str, int, int]] = field(default_factory=list)
    checks: int = 0
    seen: set[str] = field(default_factory=set)

    def check(self, rng: random.Random, size: int, evidence_at: int, n: int) -> None:
        tool, args = rng.choice(TOOLS), f"{rng.choice(TOOLS)}:{rng.choice(ARGS)}"
        entry = HistoryEntry(0, tool, args, f"c{n}", self.scope.run_id)
        expected, mem_seq = self.memory.check_call(self.scope, entry, size, evidence_at, now_ms=n)
        got, redis_seq = self.redis.check_call(self.scope, entry, size, evidence_at, now_ms=n)
        assert got == expected, (n, size, entry)
        self.checks += 1
        kinds = {
            "stalled": expected.stalled > 1,
            "repeats": expected.run_repeats > 0,
            "unknown": expected.unknown_streak > 1,
            "alternation": expected.alternation > 0,
            "evidence": expected.evidence,
        }
        self.seen.update(kind for kind, present in kinds.items() if present)
        if rng.random() < 0.15:  # blocked: discarded at once, as LoopGuard does
            self.memory.discard_call(self.scope, mem_seq)
            self.redis.discard_call(self.scope, redis_seq)
        else:
            self.pending.append((tool, args, f"c{n}", mem_seq, redis_seq))

    def outcome(self, rng: random.Random, size: int, n: int) -> None:
        if self.pending and rng.random() < 0.85:
            # Mostly the oldest pending call (in order), sometimes a later one (out of order).
            index = 0 if rng.random() < 0.7 else rng.randrange(len(self.pending))
            tool, args, call_id, _, _ = self.pending.pop(index)
        else:
            tool, args, call_id = rng.choice(TOOLS), f"{rng.choice(TOOLS)}:x", f"fresh{n}"
        unknown = rng.choice(("u1", "u2")) if rng.random() < 0.3 else None
        with_id = rng.random() < 0.8
        entry = HistoryEntry(
            0, tool, args, call_id if with_id else None, self.scope.run_id, rng.choice(("h1", "h2")), unknown
        )
        self.memory.record_outcome(self.scope, entry, size, None, now_ms=n)
        self.redis.record_outcome(self.scope, entry, size, None, now_ms=n)

    def discard_older(self, rng: random.Random) -> None:
        """Discard a pending call that is not the newest record (never done by LoopGuard; must hold)."""
        if self.pending:
            _, _, _, mem_seq, redis_seq = self.pending.pop(rng.randrange(len(self.pending)))
            self.memory.discard_call(self.scope, mem_seq)
            self.redis.discard_call(self.scope, redis_seq)


# The library's own rebuild, into a scratch hash beside the run's state (same hash tag).
_REBUILD = script_text(LOOP_STATE_LIBRARY) + "rebuild(KEYS[1], KEYS[2], tonumber(ARGV[1]))\nreturn 1"
# Kept for loop_discard.lua only: the state before the last append, never rebuilt.
_APPEND_UNDO = {"alt_prev", "alt_seq"}


def _state_and_rebuild(
    client: redis.Redis, scope: RunScope, size: int
) -> tuple[dict[str, str], dict[str, str]]:
    """The run's incrementally kept state and the state rebuilt from its window, as hashes."""
    keys = RunKeys("p", scope.session_key, scope.run_id)
    scratch = keys.loop_state + ":rebuilt"
    client.eval(_REBUILD, 2, keys.history, scratch, size)
    kept = {str(k): str(v) for k, v in client.hgetall(keys.loop_state).items()}
    rebuilt = {str(k): str(v) for k, v in client.hgetall(scratch).items()}
    client.delete(scratch)
    return {k: v for k, v in kept.items() if k not in _APPEND_UNDO}, rebuilt


def _random_run(seed: int, client: redis.Redis, *, compare_state: bool = False) -> Twin:
    rng = random.Random(seed)
    store = RedisLoopHistory(client, prefix="p", ttl_s=60)
    twin = Twin(InMemoryLoopHistory(), store, RunScope("s", f"r{seed}"))
    size = rng.choice((1, 2, 3, 5, 8))
    for n in range(400):
        roll = rng.random()
        if roll < 0.02:
            size = rng.choice((1, 2, 3, 5, 8))  # a config change: the state is rebuilt
        elif roll < 0.05:
            twin.discard_older(rng)
        elif roll < 0.5:
            twin.check(rng, size, evidence_at=rng.choice((2, 3, 4)), n=n)
        else:
            twin.outcome(rng, size, n)
        if compare_state and n % 7 == 0:
            kept, rebuilt = _state_and_rebuild(client, twin.scope, size)
            if "size" in kept and kept["size"] == str(size):  # not marked for a rebuild, and not resized
                assert kept == rebuilt, (seed, n, size)
    return twin


def test_signals_match_the_reference_through_random_runs(loop_redis: redis.Redis) -> None:
    # Given the same runs on both stores, small histories and few distinct calls (so that
    # streaks, repeats, ping-pong and evictions all happen)
    seen: set[str] = set()
    for seed in range(12):
        # When random operations run on both, Then every check sees equal signals
        twin = _random_run(seed, loop_redis)
        assert twin.checks > 100
        seen |= twin.seen
    # And the runs met every kind of signal, so each was compared
    assert seen == {"stalled", "repeats", "unknown", "alternation", "evidence"}


def test_the_kept_state_equals_a_rebuild_from_the_window(loop_redis: redis.Redis) -> None:
    # Given random runs (checks, outcomes in and out of order, discards, resizes)
    # When the state kept step by step is compared with one rebuilt from the window
    # Then every counter, streak and the alternating tail are equal, field by field
    for seed in range(100, 106):
        assert _random_run(seed, loop_redis, compare_state=True).checks > 100


def test_a_ping_pong_with_evidence_and_an_unknown_streak_are_seen_alike(loop_redis: redis.Redis) -> None:
    # Given alternating calls with fixed outcomes, then repeated unknown-tool answers
    twin = Twin(
        InMemoryLoopHistory(), RedisLoopHistory(loop_redis, prefix="p", ttl_s=60), RunScope("s", "pp")
    )
    for n in range(12):
        args = "a:x" if n % 2 == 0 else "a:y"
        for store in (twin.memory, twin.redis):
            store.check_call(twin.scope, HistoryEntry(0, "a", args, f"c{n}", "pp"), 10, 4, now_ms=n)
            done = HistoryEntry(0, "a", args, f"c{n}", "pp", f"h{n % 2}", "ghost" if n >= 8 else None)
            store.record_outcome(twin.scope, done, 10, None, now_ms=n)
    # When the next alternating call is checked
    entry = HistoryEntry(0, "a", "a:x", "c12", "pp")
    expected, _ = twin.memory.check_call(twin.scope, entry, 10, 4, now_ms=12)
    got, _ = twin.redis.check_call(twin.scope, entry, 10, 4, now_ms=12)
    # Then both see the same count, evidence and streak
    assert got == expected
    assert (expected.alternation, expected.evidence, expected.unknown_streak) == (11, True, 4)


def test_a_blocked_retry_of_a_full_streak_sees_the_same_streak_again(loop_redis: redis.Redis) -> None:
    # Given a full window of one call with one outcome (the streak reaches the window's start)
    twin = Twin(InMemoryLoopHistory(), RedisLoopHistory(loop_redis, prefix="p", ttl_s=60), RunScope("s", "b"))
    for n in range(5):
        for store in (twin.memory, twin.redis):
            store.check_call(twin.scope, HistoryEntry(0, "a", "a:x", f"c{n}", "b"), 3, 20, now_ms=n)
            done = HistoryEntry(0, "a", "a:x", f"c{n}", "b", "same")
            store.record_outcome(twin.scope, done, 3, None, now_ms=n)
    # When the same call is checked, blocked (discarded) and retried, twice
    for n in (5, 6):
        retry = HistoryEntry(0, "a", "a:x", f"c{n}", "b")
        expected, mem_seq = twin.memory.check_call(twin.scope, retry, 3, 20, now_ms=n)
        got, redis_seq = twin.redis.check_call(twin.scope, retry, 3, 20, now_ms=n)
        twin.memory.discard_call(twin.scope, mem_seq)
        twin.redis.discard_call(twin.scope, redis_seq)
        # Then each retry sees the whole window's streak, as the first check did
        assert got == expected
        assert (expected.stalled, expected.recent) == (3, 3)
