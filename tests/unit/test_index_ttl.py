"""The index TTL refresh: once per interval per key, and over-extended by that interval."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from workers.store import keys as index_ttl
from workers.store.keys import REFRESH_INTERVAL_S, IndexTtl


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(index_ttl, "time", SimpleNamespace(monotonic=lambda: now[0]))
    return now


def test_a_key_is_refreshed_once_per_interval(clock: list[float]) -> None:
    ttl = IndexTtl(100)
    assert ttl.due("a")
    assert not ttl.due("a")
    assert ttl.due("b")  # each key on its own
    clock[0] += REFRESH_INTERVAL_S - 0.001
    assert not ttl.due("a")
    clock[0] += 0.001
    assert ttl.due("a")


def test_the_ttl_covers_writes_until_the_next_refresh() -> None:
    # A write just before the next refresh still has its full ttl_s ahead of it.
    assert IndexTtl(100).expire_s == 100 + REFRESH_INTERVAL_S


def test_forget_makes_every_key_due_again(clock: list[float]) -> None:
    ttl = IndexTtl(100)
    assert ttl.due("a")
    assert ttl.due("b")
    ttl.forget()
    assert ttl.due("a")
    assert ttl.due("b")
