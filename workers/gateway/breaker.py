"""Shared circuit breakers at the gateway's admission: refuse at once while a tool's circuit is open.

Only tools named in ``tools.breakers`` are checked (one store read per call of such a tool;
none for the others). Decisions are :mod:`workers.core.breaker`'; counts and transitions
live in Redis (:mod:`workers.store.breaker`), shared by every gateway and session.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from workers.core.breaker import (
    BreakerPolicy,
    BreakerSnapshot,
    Transition,
    admit,
    after_outcome,
    counts_as_failure,
)
from workers.core.models import SyntheticReason, ToolCall, ToolResult
from workers.core.results import synthetic_result
from workers.errors import StoreError
from workers.store.breaker import BreakerStore
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger

__all__ = ["BreakerGate", "circuit_open_result"]

log = logging.getLogger(__name__)

_CAS_TRIES = 3
_ADMITTED_CAP = 65536
BREAKER_EVENT = "unstuck-breaker"


def circuit_open_result(call: ToolCall, retry_after_ms: int) -> ToolResult:
    """The immediate answer while ``call``'s tool has its circuit open."""
    retry_after_s = round(max(0, retry_after_ms) / 1000, 1)
    return synthetic_result(
        call,
        SyntheticReason.CIRCUIT_OPEN,
        elapsed_ms=0,
        attempt=0,
        detail=f" for another {retry_after_s:g}s",
        extra={"retry_after_s": retry_after_s},
    )


class BreakerGate:
    """Admission and outcome recording for the tools that have a breaker."""

    def __init__(
        self,
        policies: Mapping[str, BreakerPolicy],
        ledger: Ledger,
        *,
        now_ms: Callable[[], int],
        emit: Callable[[str, dict[str, Any]], None],
    ) -> None:
        self._policies = dict(policies)
        self._store = BreakerStore(ledger) if self._policies else None
        self._now_ms = now_ms
        self._emit = emit
        self._admitted: dict[tuple[str, str], bool] = {}  # (run tag, call id) -> admitted as a probe

    def admit(self, keys: RunKeys, call: ToolCall) -> ToolResult | None:
        """None when ``call`` may run; else its ``circuit_open`` answer."""
        policy = self._policies.get(call.name)
        if policy is None or self._store is None:
            return None
        try:
            for _ in range(_CAS_TRIES):
                now = self._now_ms()
                snapshot = self._store.read(call.name)
                admission = admit(snapshot, policy, now)
                if not admission.allowed:
                    return circuit_open_result(call, admission.retry_after_ms)
                change = admission.transition
                if change is None or self._apply(call.name, policy, snapshot, change):
                    if len(self._admitted) >= _ADMITTED_CAP:  # answers this gateway never saw
                        self._admitted.pop(next(iter(self._admitted)))
                    self._admitted[(keys.tag, call.id)] = admission.probe
                    return None
            return circuit_open_result(call, 0)  # other gateways took the probe slots meanwhile
        except StoreError as exc:
            log.warning("breaker of %s not checked: %s", call.name, exc)  # the breaker steps aside
            return None

    def record(self, keys: RunKeys, answers: Mapping[str, ToolResult]) -> None:
        """Count the outcomes of the admitted calls among ``answers``."""
        if self._store is None:
            return
        for call_id, result in answers.items():
            probe = self._admitted.pop((keys.tag, call_id), None)
            policy = self._policies.get(result.tool_name)
            if probe is None or policy is None:
                continue
            try:
                self._record_one(keys, call_id, result, policy, probe)
            except StoreError as exc:
                log.warning("breaker outcome of %s not recorded: %s", call_id, exc)

    def _record_one(
        self, keys: RunKeys, call_id: str, result: ToolResult, policy: BreakerPolicy, probe: bool
    ) -> None:
        assert self._store is not None
        tool, failed, now = result.tool_name, counts_as_failure(result), self._now_ms()
        if failed:
            recent, snapshot = self._store.count_failure(tool, policy, keys, call_id, now_ms=now)
        elif probe:
            recent, snapshot = 0, self._store.read(tool)
        else:
            return  # a success while closed changes nothing: no write
        change = after_outcome(
            snapshot, policy, failed=failed, probe=probe, recent_failures=recent, now_ms=now
        )
        if change is not None:
            self._apply(tool, policy, snapshot, change, failures=recent)

    def _apply(
        self,
        tool: str,
        policy: BreakerPolicy,
        snapshot: BreakerSnapshot,
        change: Transition,
        failures: int = 0,
    ) -> bool:
        assert self._store is not None
        applied = self._store.apply(tool, policy, snapshot, change)
        if applied and change.state is not snapshot.state:
            fields = {"tool": tool, "state": change.state.value, "previous": snapshot.state.value}
            self._emit(BREAKER_EVENT, {**fields, "failures": failures})
        return applied
