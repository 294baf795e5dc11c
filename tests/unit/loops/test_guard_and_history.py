"""Post-compaction guard, in-memory history rules and warning de-duplication."""

from __future__ import annotations

import pytest

from workers.core.loops import HistoryEntry, InMemoryLoopHistory, RunScope
from workers.core.loops.guard import arm_guard, guard_abort_count, guard_message, observe_guard
from workers.core.loops.history import WARNING_KEY_LIMIT

T = ("gateway", "gateway:a", "r")
SCOPE = RunScope("s", "run")


def _feed(window_size: int, triples: list[tuple[str, str, str]]) -> list[int | None]:
    state = arm_guard(window_size)
    counts: list[int | None] = []
    for triple in triples:
        state, window = observe_guard(state, triple)
        counts.append(None if window is None else guard_abort_count(window, triple, window_size))
    return counts


@pytest.mark.parametrize(
    ("window_size", "triples", "counts"),
    [
        (3, [T, T, T], [None, None, 3]),
        (3, [T, T, T, T], [None, None, 3, None]),
        (3, [T, (*T[:2], "x"), T], [None, None, None]),
        (3, [T, ("gateway", "gateway:b", "r"), T], [None, None, None]),
        (2, [T, T], [None, 2]),
        (1, [T, T], [1, None]),
    ],
)
def test_guard_aborts_only_when_the_whole_window_repeats(
    window_size: int, triples: list[tuple[str, str, str]], counts: list[int | None]
) -> None:
    assert _feed(window_size, triples) == counts


def test_guard_message() -> None:
    message = guard_message("gateway", 3, 3)
    assert message.startswith("CRITICAL:")
    assert "3 times" in message
    assert "compaction" in message


def _call(n: int, tool: str = "read") -> HistoryEntry:
    return HistoryEntry(0, tool, f"{tool}:{n}", tool_call_id=f"c{n}")


def test_record_call_returns_the_window_before_the_call_and_keeps_one_spare() -> None:
    # Given a history of size 3
    history = InMemoryLoopHistory()
    for n in range(5):
        window, seq = history.record_call(SCOPE, _call(n), 3, now_ms=n)
    # Then the last call saw the 3 calls before it, and 4 records are stored
    assert [e.args_hash for e in window] == ["read:1", "read:2", "read:3"]
    assert seq == 5
    assert len(history.entries(SCOPE)) == 4


def test_discarding_a_blocked_call_restores_the_window() -> None:
    history = InMemoryLoopHistory()
    for n in range(3):
        history.record_call(SCOPE, _call(n), 3, now_ms=n)
    before, _ = history.record_call(SCOPE, _call(9), 3, now_ms=9)
    history.discard_call(SCOPE, 4)
    after, _ = history.record_call(SCOPE, _call(9), 3, now_ms=10)
    assert after == before


def test_outcome_attaches_to_the_pending_call_or_appends() -> None:
    history = InMemoryLoopHistory()
    history.record_call(SCOPE, _call(1), 3, now_ms=1)
    history.record_outcome(SCOPE, HistoryEntry(0, "read", "read:1", "c1", result_hash="h"), 3, None, now_ms=2)
    history.record_outcome(
        SCOPE, HistoryEntry(0, "read", "read:1", "c9", result_hash="h2"), 3, None, now_ms=3
    )
    stored = history.entries(SCOPE)
    assert [(e.tool_call_id, e.result_hash) for e in stored] == [("c1", "h"), ("c9", "h2")]


def test_runs_do_not_share_history() -> None:
    history = InMemoryLoopHistory()
    history.record_call(RunScope("s", "a"), _call(1), 3, now_ms=1)
    window, _ = history.record_call(RunScope("s", "b"), _call(1), 3, now_ms=2)
    assert window == []


def test_warning_buckets_emit_once_per_bucket_and_evict_oldest_key() -> None:
    history = InMemoryLoopHistory()
    assert [history.note_warning(SCOPE, "k", b, 0) for b in (0, 1, 1, 2, 1, 3)] == [
        False,
        True,
        False,
        True,
        False,
        True,
    ]
    for n in range(WARNING_KEY_LIMIT):
        history.note_warning(SCOPE, f"key{n}", 1, 0)
    # "k" was inserted first, so it was evicted and its bucket forgotten.
    assert history.note_warning(SCOPE, "k", 1, 0) is True
    assert history.note_warning(SCOPE, f"key{WARNING_KEY_LIMIT - 1}", 1, 0) is False
