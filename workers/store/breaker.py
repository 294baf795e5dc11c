"""The shared circuit breakers of tools in Redis: counts and compare-and-set transitions.

Decisions are :mod:`workers.core.breaker`'; this module reads a breaker, counts a failure
(``breaker_failure.lua``) and applies a decided transition only if the breaker's generation
is still the one read (``breaker_apply.lua``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from workers.core.breaker import BreakerPolicy, BreakerSnapshot, BreakerState, Transition, describe
from workers.store.connection import store_errors
from workers.store.keys import BreakerKeys, RunKeys
from workers.store.ledger import Ledger
from workers.store.lua import load_script
from workers.store.records import BREAKER, BreakerField, Row

__all__ = ["BreakerStore"]

_FIELDS = (BreakerField.STATE, BreakerField.SINCE_MS, BreakerField.PROBES, BreakerField.GENERATION)


def _snapshot(reply: Sequence[Any], where: str) -> BreakerSnapshot:
    row = Row.zip(BREAKER, _FIELDS, reply, where=where)
    return BreakerSnapshot(
        state=row.member(BreakerField.STATE, BreakerState),
        since_ms=row.integer(BreakerField.SINCE_MS),
        probes=row.integer(BreakerField.PROBES),
        generation=row.integer(BreakerField.GENERATION),
    )


def _ttl_ms(policy: BreakerPolicy) -> int:
    return int((policy.window_s + policy.cooldown_s) * 1000)


class BreakerStore:
    """Every method raises ``StoreError`` when Redis fails."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._failure = load_script(ledger.client, "breaker_failure.lua")
        self._apply = load_script(ledger.client, "breaker_apply.lua")

    def keys(self, tool: str) -> BreakerKeys:
        """The keys of ``tool``'s breaker."""
        return BreakerKeys(self.ledger.prefix, tool)

    def read(self, tool: str) -> BreakerSnapshot:
        """The breaker as stored (closed, generation 0, when never written or expired)."""
        key = self.keys(tool).state
        with store_errors():
            reply = self.ledger.client.hmget(key, _FIELDS)
        return _snapshot(reply, key)

    def read_all(
        self, tools: Sequence[str], *, now_ms: int, window_ms: Sequence[int]
    ) -> list[tuple[BreakerSnapshot, int]]:
        """Each tool's breaker and its failures within its window, in one round trip."""
        with store_errors():
            pipe = self.ledger.client.pipeline(transaction=False)
            for tool, window in zip(tools, window_ms, strict=True):
                pipe.hmget(self.keys(tool).state, _FIELDS)
                pipe.zcount(self.keys(tool).failures, now_ms - window, "+inf")
            replies = pipe.execute()
        return [
            (_snapshot(replies[2 * i], self.keys(tool).state), int(replies[2 * i + 1]))
            for i, tool in enumerate(tools)
        ]

    def count_failure(
        self, tool: str, policy: BreakerPolicy, keys: RunKeys, call_id: str, *, now_ms: int
    ) -> tuple[int, BreakerSnapshot]:
        """Count a failed call of ``tool``; returns the failures within the window and the breaker."""
        bkeys = self.keys(tool)
        args = [now_ms, int(policy.window_s * 1000), keys.due_member(call_id), _ttl_ms(policy)]
        with store_errors():
            count, *reply = self._failure(keys=[bkeys.state, bkeys.failures], args=args)
        return int(count), _snapshot(reply, bkeys.state)

    def apply(self, tool: str, policy: BreakerPolicy, expected: BreakerSnapshot, change: Transition) -> bool:
        """Apply ``change`` if the breaker is still at ``expected``'s generation."""
        bkeys = self.keys(tool)
        args = [
            expected.generation,
            change.state.value,
            change.since_ms,
            change.probes,
            "1" if change.clear_failures else "0",
            _ttl_ms(policy),
        ]
        with store_errors():
            return bool(self._apply(keys=[bkeys.state, bkeys.failures], args=args))

    def overview(self, policies: Mapping[str, BreakerPolicy], *, now_ms: int) -> list[dict[str, object]]:
        """Every configured breaker as :func:`workers.core.breaker.describe` shows it, by tool name."""
        tools = sorted(policies)
        windows = [int(policies[tool].window_s * 1000) for tool in tools]
        rows = self.read_all(tools, now_ms=now_ms, window_ms=windows)
        return [
            describe(tool, snapshot, policies[tool], recent, now_ms)
            for tool, (snapshot, recent) in zip(tools, rows, strict=True)
        ]
