"""`unstuck config check` warns about a Redis that cannot survive a failure."""

from __future__ import annotations

from workers.core.durability_checks import RedisDurability, check_durability, replicas_meaning


def test_a_replicated_aof_noeviction_redis_gets_no_warning() -> None:
    assert check_durability(RedisDurability(replicas=2, aof=True, eviction_policy="noeviction")) == []


def test_one_replica_is_warned_about_with_the_window_it_leaves() -> None:
    [warning] = check_durability(RedisDurability(replicas=1, aof=True, eviction_policy="noeviction"))
    assert "one replica" in warning.message
    assert "run two replicas" in warning.message


def test_the_replicas_are_told_with_what_they_mean() -> None:
    def meaning(replicas: int | None) -> str | None:
        return replicas_meaning(RedisDurability(replicas=replicas, aof=True, eviction_policy="noeviction"))

    assert meaning(None) is None
    assert "no replica" in str(meaning(0))
    assert "has 1 replica: one failover loses no acknowledged answer" in str(meaning(1))
    assert "has 2 replicas" in str(meaning(2))


def test_each_missing_safeguard_is_named_with_its_fix() -> None:
    found = check_durability(RedisDurability(replicas=0, aof=False, eviction_policy="allkeys-lru"))
    messages = [w.message for w in found]
    assert len(messages) == 3
    assert "no replica" in messages[0]
    assert "appendonly yes" in messages[1]
    assert "allkeys-lru" in messages[2]
    assert "noeviction" in messages[2]
    assert {w.path for w in found} == {"unstuck.redis.url"}


def test_what_the_server_does_not_say_is_not_warned_about() -> None:
    assert check_durability(RedisDurability(replicas=None, aof=None, eviction_policy=None)) == []
