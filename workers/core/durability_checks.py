"""What the Redis that holds the ledger lacks to survive a failure (``unstuck config check``).

Read from the server itself (its INFO), not from our settings: a primary without a replica
loses the ledger with its host, one without AOF loses what it held since its last snapshot
on a restart, and an evicting ``maxmemory-policy`` deletes ledger records under memory
pressure (a call's one answer gone). See docs/failover.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.core.config_checks import ConfigWarning

__all__ = ["RedisDurability", "check_durability", "replicas_meaning"]

_PATH = "unstuck.redis.url"


@dataclass(frozen=True)
class RedisDurability:
    """What the server reports; None where it did not say (a managed service hiding INFO fields)."""

    replicas: int | None
    aof: bool | None
    eviction_policy: str | None


def check_durability(found: RedisDurability) -> list[ConfigWarning]:
    """A warning for each of: no replica, no AOF, an eviction policy other than noeviction."""
    warnings: list[ConfigWarning] = []
    if found.replicas == 0:
        warnings.append(
            ConfigWarning(
                _PATH,
                "the Redis primary has no replica: its host's death loses the ledger; run a replica "
                "and Sentinel (docs/failover.md)",
            )
        )
    if found.replicas == 1:
        warnings.append(
            ConfigWarning(
                _PATH,
                "the Redis primary has one replica: after a failover the promoted one has none until "
                "the old primary is back in sync (8-15 s), and what it takes meanwhile is held by one "
                "node and by the processes that handed it on; a second failover in that window loses "
                "the answers of a process that died meanwhile; run two replicas (docs/failover.md)",
            )
        )
    if found.aof is False:
        warnings.append(
            ConfigWarning(
                _PATH,
                "the Redis has no AOF (appendonly no): a restart loses what it held since its last "
                "snapshot; set appendonly yes",
            )
        )
    if found.eviction_policy is not None and found.eviction_policy != "noeviction":
        warnings.append(
            ConfigWarning(
                _PATH,
                f"maxmemory-policy is {found.eviction_policy}: Redis may evict ledger records (a "
                "call's one answer) under memory pressure; set maxmemory-policy noeviction",
            )
        )
    return warnings


def replicas_meaning(found: RedisDurability) -> str | None:
    """One line for an operator: how many replicas the primary has and what that means for the promise."""
    if found.replicas is None:
        return None
    if found.replicas == 0:
        return "the Redis primary has no replica: every answer is lost with its host"
    if found.replicas == 1:
        return (
            "the Redis primary has 1 replica: one failover loses no acknowledged answer; a second one"
            " before the first resyncs is covered by the processes that handed answers on (they keep"
            " them and write them back), not by Redis"
        )
    return (
        f"the Redis primary has {found.replicas} replicas: a second failover before the first"
        " resyncs still promotes a replica that holds every acknowledged answer"
    )
