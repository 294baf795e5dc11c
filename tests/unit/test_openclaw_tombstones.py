"""Sessions OpenClaw's restart recovery tombstoned, read from ``sessions.list``: each alerted once."""

from __future__ import annotations

from typing import Any

from workers.core.openclaw_tombstones import (
    Tombstone,
    complete,
    tombstone_changes,
    tombstone_note,
    tombstones,
)


def _row(key: str, session_id: str, status: str | None = None) -> dict[str, Any]:
    # The fields OpenClaw 2026.9.6's sessions.list rows carry (restartRecoveryStatus only when set).
    row: dict[str, Any] = {"key": key, "sessionId": session_id, "status": "failed", "hasActiveRun": False}
    if status is not None:
        row["restartRecoveryStatus"] = status
    return row


def test_only_rows_marked_tombstoned_are_tombstones() -> None:
    answer = {
        "sessions": [
            _row("agent:main:explicit:a", "a1", "tombstoned"),
            _row("agent:main:explicit:b", "b1"),
            {"sessionId": "no-key", "restartRecoveryStatus": "tombstoned"},
            "not a row",
        ],
        "hasMore": False,
    }
    assert tombstones(answer) == {Tombstone("agent:main:explicit:a", "a1")}


def test_an_answer_without_sessions_has_no_tombstones() -> None:
    assert tombstones({}) == set()
    assert tombstones({"sessions": None}) == set()


def test_a_new_tombstone_is_alerted_and_a_known_one_is_not() -> None:
    a, b = Tombstone("a", "1"), Tombstone("b", "1")
    assert tombstone_changes({a, b}, {a}, complete=True) == ({b}, set())


def test_a_tombstone_no_longer_reported_is_forgotten_so_a_new_one_alerts_again() -> None:
    a = Tombstone("a", "1")
    new, gone = tombstone_changes(set(), {a}, complete=True)
    assert (new, gone) == (set(), {a})
    assert tombstone_changes({a}, {a} - gone, complete=True) == ({a}, set())


def test_a_reset_session_is_a_new_generation() -> None:
    old, replaced = Tombstone("a", "1"), Tombstone("a", "2")
    assert tombstone_changes({replaced}, {old}, complete=True) == ({replaced}, {old})


def test_a_partial_answer_forgets_nothing() -> None:
    a = Tombstone("a", "1")
    assert complete({"hasMore": True}) is False
    assert complete({"hasMore": False}) is True
    assert tombstone_changes(set(), {a}, complete=False) == (set(), set())


def test_the_note_names_the_session_and_the_remedy() -> None:
    note = tombstone_note(Tombstone("agent:main:explicit:a", "a1"))
    assert "agent:main:explicit:a" in note
    assert "/new" in note
    assert "/reset" in note
