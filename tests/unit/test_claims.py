"""A claim's reply, read: the earlier attempt comes with a claim that executes a call again."""

from __future__ import annotations

from workers.core.idempotency import idempotency_key
from workers.core.models import ClaimStatus
from workers.store.claims import claim_of


def test_a_first_claim_names_no_earlier_attempt() -> None:
    claim = claim_of(["claimed", 1, "echo"])
    assert (claim.status, claim.attempt, claim.registered_tool) == (ClaimStatus.CLAIMED, 1, "echo")
    assert (claim.previous_worker, claim.previous_started_ms) == ("", 0)
    assert not claim.executes_again


def test_a_second_claim_names_the_first_and_executes_again() -> None:
    claim = claim_of(["claimed", 2, "echo", "host:11", 1_764_646_000_000])
    assert claim.executes_again
    assert (claim.previous_worker, claim.previous_started_ms) == ("host:11", 1_764_646_000_000)


def test_a_refused_claim_never_executes_again() -> None:
    assert not claim_of(["busy", 3, "echo"]).executes_again
    assert not claim_of(["done", 2, ""]).executes_again


def test_the_idempotency_key_is_the_calls_not_the_attempts() -> None:
    key = idempotency_key("s", "r", "c1")
    assert key == idempotency_key("s", "r", "c1")
    assert key.startswith("uk-")
    assert len(key) == 35
    assert key != idempotency_key("s", "r", "c2")
    # ids that would run together when joined stay apart
    assert idempotency_key("a/b", "c", "d") != idempotency_key("a", "b/c", "d")
