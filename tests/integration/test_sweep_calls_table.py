"""The sweep's call probe against its rules, row by row of a generated table.

The sweep probes due calls with one pipelined read and decides with ``_probe_verdict``; the
calls found are then reaped by :func:`workers.core.waiting.decide`. Every combination of the
inputs the probe and ``decide`` branch on is generated (``CALL_TABLE``), written through the
ledger's write paths, swept once by :func:`sweep_due_calls`, and checked case by case
against the probe and ``decide`` computed from the case itself (the call's answer, its index
members, its lease).

Inputs: state (record gone, answered, queued, running), deadline (one ms past, exactly now, one
ms ahead, exactly ``min_rerun`` ahead), the lease key (missing, no expiry, alive), dispatched,
submission age (one ms under, exactly at, twice a lease), membership of the due index and of the
lease index (absent, score exactly now, one ms ahead) and idempotency. A lease is crossed with
running calls only: no write path leaves one on a call that is not running. Written directly:
the lease's expiry and the index members (their scores are the probe's input).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest

from tests.integration.sweep_parity import (
    ALIVE_MS,
    CALL,
    LEASE_MS,
    NOW,
    RUN,
    clients,
    lease_score,
    ok_result,
    product,
    sweep_settings,
)
from workers.core.models import CallState, SyntheticReason
from workers.core.reaping import OpenCall, decide
from workers.local.embedded_redis import EmbeddedRedis
from workers.store.ledger import Ledger
from workers.store.records import CALL as CALL_RECORD
from workers.store.records import CallField, Row
from workers.store.sweep_probe import _probe_verdict
from workers.watchdog.due_calls import sweep_due_calls

# The first test builds the module fixture, a sweep of every stored case; under a loaded
# parallel run that alone can pass the suite-wide 120 s.
pytestmark = pytest.mark.timeout(600)

CALL_DEADLINES = {"past": NOW - 1, "now": NOW, "ahead": NOW + 1, "rerun": NOW + LEASE_MS}
SUBMITTED = {"fresh": NOW - LEASE_MS + 1, "lease": NOW - LEASE_MS, "old": NOW - 2 * LEASE_MS}
LEASE_LEFT = {"missing": -2, "no_ttl": -1, "alive": ALIVE_MS}
LEASE_INDEX = {"absent": None, "lapsed": NOW, "ahead": NOW + 1}


@dataclass(frozen=True)
class CallCase:
    """One row of the call table: a call record, its lease and its index members as written."""

    state: str  # gone | done | pending | running
    deadline: str
    lease: str
    dispatched: bool
    submitted: str
    due_index: bool
    lease_index: str
    idempotent: bool

    @property
    def id(self) -> str:
        return (
            f"{self.state}-deadline:{self.deadline}-lease:{self.lease}"
            f"-{'dispatched' if self.dispatched else 'undispatched'}-submitted:{self.submitted}"
            f"-due_index:{'in' if self.due_index else 'out'}-lease_index:{self.lease_index}"
            f"-{'idempotent' if self.idempotent else 'once'}"
        )

    @property
    def candidate(self) -> bool:
        """Whether the probe reads it: due by deadline, or its recorded lease ran out."""
        lease_score = LEASE_INDEX[self.lease_index]
        return (self.due_index and CALL_DEADLINES[self.deadline] <= NOW) or (
            lease_score is not None and lease_score <= NOW
        )


CALL_TABLE: dict[str, Iterable[Any]] = {
    "state": ("gone", "done", "pending", "running"),
    "deadline": CALL_DEADLINES,
    "lease": LEASE_LEFT,
    "dispatched": (True, False),
    "submitted": SUBMITTED,
    "due_index": (True, False),
    "lease_index": LEASE_INDEX,
    "idempotent": (True, False),
}
CALL_CASES = [
    case
    for case in (CallCase(**row) for row in product(**CALL_TABLE))
    if case.state == "running" or case.lease == "missing"
]


@dataclass(frozen=True)
class CallOutcome:
    """What a sweep leaves of a call: its state and reason, index scores, lease key."""

    state: str | None
    reason: str | None
    due: int | None
    leases: int | str | None
    lease_key: bool


def _call_as_written(case: CallCase) -> CallOutcome:
    return CallOutcome(
        None if case.state == "gone" else case.state,
        "" if case.state == "done" else None,
        CALL_DEADLINES[case.deadline] if case.due_index else None,
        LEASE_INDEX[case.lease_index],
        case.lease != "missing",
    )


def _open_call(case: CallCase) -> OpenCall:
    return OpenCall(
        CALL, "echo", CallState(case.state), CALL_DEADLINES[case.deadline], int(case.state == "running"),
        case.lease != "missing", case.idempotent, case.dispatched, SUBMITTED[case.submitted],
    )  # fmt: skip


def probe_verdict(case: CallCase) -> str:
    """The pure probe: reap, drop, rescore, unhold or keep."""
    fields: dict[CallField, str] = {}
    if case.state != "gone":
        fields = {
            CallField.STATE: case.state,
            CallField.DEADLINE_MS: str(CALL_DEADLINES[case.deadline]),
            CallField.SUBMITTED_MS: str(SUBMITTED[case.submitted]),
            CallField.DISPATCHED: "1" if case.dispatched else "0",
        }
    return _probe_verdict(Row(CALL_RECORD, fields), LEASE_LEFT[case.lease], now_ms=NOW, lease_ms=LEASE_MS)


def expected_call(case: CallCase, verdict: str | None = None) -> CallOutcome:
    """What the sweep must leave, from the pure probe and ``decide`` (``verdict`` overrides)."""
    before = _call_as_written(case)
    if not case.candidate:
        return before
    verdict = verdict or probe_verdict(case)
    if verdict == "drop":
        return replace(before, due=None, leases=None)
    # A member left in the due index is due at its deadline again: as written here, unchanged.
    if verdict == "unhold":
        return replace(before, leases=None)
    if verdict == "rescore":  # into the lease index by the lease's real end, present or not
        left = LEASE_LEFT[case.lease]
        return replace(before, leases=lease_score(NOW + (left if left > 0 else LEASE_MS)))
    if verdict == "keep":
        return before
    actions = decide([_open_call(case)], now_ms=NOW, min_rerun_ms=LEASE_MS, undispatched_after_ms=LEASE_MS)
    if not actions:
        return before
    reason = actions[0].reason or SyntheticReason.WORKER_LOST  # nobody re-dispatches in a sweep
    return CallOutcome("done", reason.value, None, None, before.lease_key)  # the answer leaves the lease


def write_call(ledger: Ledger, n: int, case: CallCase) -> None:
    """Write one call case under ``ledger``'s prefix, in session ``s<n>`` (no run record)."""
    keys = ledger.keys(f"s{n}", RUN)
    deadline, submitted = CALL_DEADLINES[case.deadline], SUBMITTED[case.submitted]
    flags = {"idempotent": str(int(case.idempotent)), "dispatched": str(int(case.dispatched))}
    ledger.register_call(
        keys,
        CALL,
        now_ms=submitted,
        deadline_ms=deadline,
        fields={"tool": "echo", "job_digest": "d", **flags},
    )
    if case.state in ("running", "done"):
        ledger.claim(keys, CALL, worker_id="w:1", now_ms=submitted, tool="echo", job_digest="d")
    if case.state == "done":
        ledger.finish(keys, ok_result(CALL), now_ms=submitted, writer="w:1")
    # The lease's expiry and the index members as the case has them: written directly.
    pipe = ledger.client.pipeline(transaction=True)
    lease = keys.lease(CALL)
    pipe.delete(lease)
    if case.lease == "no_ttl":
        pipe.set(lease, "w:1")
    elif case.lease == "alive":
        pipe.set(lease, "w:1", px=ALIVE_MS)
    if case.state == "gone":
        pipe.delete(keys.call(CALL))
    member, due, leases = keys.due_member(CALL), keys.index.due, keys.index.leases
    pipe.zrem(due, member)
    if case.due_index:
        pipe.zadd(due, {member: deadline})
    pipe.zrem(leases, member)
    if (score := LEASE_INDEX[case.lease_index]) is not None:
        pipe.zadd(leases, {member: score})
    pipe.execute()


def _observe_calls(ledger: Ledger) -> dict[int, CallOutcome]:
    pipe = ledger.client.pipeline(transaction=False)
    for n in range(len(CALL_CASES)):
        keys = ledger.keys(f"s{n}", RUN)
        pipe.hmget(keys.call(CALL), ["state", "reason"])
        pipe.zscore(keys.index.due, keys.due_member(CALL))
        pipe.zscore(keys.index.leases, keys.due_member(CALL))
        pipe.exists(keys.lease(CALL))
    rows = pipe.execute()
    out: dict[int, CallOutcome] = {}
    for n in range(len(CALL_CASES)):
        (state, reason), due_score, leases_score, lease_key = rows[4 * n : 4 * n + 4]
        out[n] = CallOutcome(
            state, reason, None if due_score is None else int(due_score),
            None if leases_score is None else lease_score(leases_score), bool(lease_key),
        )  # fmt: skip
    return out


@dataclass(frozen=True)
class CallSweep:
    """What one sweep of every case left: each case's call, and how many calls it answered."""

    outcomes: dict[int, CallOutcome]
    answered: int


@pytest.fixture(scope="module")
def call_sweep(redis_server: EmbeddedRedis) -> Iterator[CallSweep]:
    """Every call case, written and swept once."""
    with clients(redis_server.url) as (client, _):
        ledger = Ledger(client, prefix="calls", ttl_s=3600, lease_ttl_ms=LEASE_MS)
        for n, case in enumerate(CALL_CASES):
            write_call(ledger, n, case)
        answered = sweep_due_calls(ledger, now_ms=NOW, settings=sweep_settings(), writer="wd")
        yield CallSweep(_observe_calls(ledger), answered)


@pytest.mark.parametrize("n", range(len(CALL_CASES)), ids=[case.id for case in CALL_CASES])
def test_the_probe_treats_each_call_as_its_rules(call_sweep: CallSweep, n: int) -> None:
    # Given one generated call, probed and reaped by one sweep
    case = CALL_CASES[n]
    # Then the sweep did what the probe's verdict and decide say
    assert call_sweep.outcomes[n] == expected_call(case)


def test_the_sweep_answers_the_overdue_and_lost_calls(call_sweep: CallSweep) -> None:
    # Given every case swept once
    done = {n for n, outcome in call_sweep.outcomes.items() if outcome.state == "done"}
    answered = [n for n, case in enumerate(CALL_CASES) if case.state != "done" and n in done]
    # Then the count the sweep returns is the calls it answered, and the table holds many
    assert call_sweep.answered == len(answered) > 100


def test_an_altered_probe_verdict_is_detected(call_sweep: CallSweep) -> None:
    # Given the probe's verdicts with one altered: calls whose worker was lost kept, not reaped
    def altered(case: CallCase) -> CallOutcome:
        verdict = probe_verdict(case)
        overdue = CALL_DEADLINES[case.deadline] <= NOW
        lost = case.state == "running" and case.lease == "missing" and not overdue and verdict == "reap"
        return expected_call(case, "keep" if lost else verdict)

    lost = {
        n for n, case in enumerate(CALL_CASES)
        if case.candidate and altered(case) != expected_call(case)
    }  # fmt: skip
    # When the sweep's outcomes are compared with it
    wrong = {n for n, case in enumerate(CALL_CASES) if call_sweep.outcomes[n] != altered(case)}
    # Then exactly the altered rows fail
    assert wrong == lost
    assert len(lost) > 10
