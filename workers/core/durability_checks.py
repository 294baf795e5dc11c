"""What the Redis that holds the ledger lacks to survive a failure (``unstuck config check``).

Read from the server itself (its INFO), not from our settings: a primary without a replica
loses the ledger with its host, one without AOF loses what it held since its last snapshot
on a restart, and an evicting ``maxmemory-policy`` deletes ledger records under memory
pressure (a call's one answer gone). See docs/failover.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.core.config_checks import ConfigWarning

__all__ = ["RedisDurability", "check_durability"]

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
