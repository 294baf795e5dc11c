"""The worker's record of messages it took ahead: what is due for giving back, and when."""

from __future__ import annotations

from workers.worker.held_messages import HeldMessages


class _Request:
    """A stand-in for Celery's request: the record keys by the object, never by its fields."""

    def __init__(self, task_id: str) -> None:
        self.id = task_id


def test_a_message_is_due_once_it_waited_the_delay_and_only_once() -> None:
    held = HeldMessages()
    first, second = _Request("t1"), _Request("t2")
    held.taken(first, now_ms=1_000)
    held.taken(second, now_ms=1_100)
    assert held.due(1_249, after_ms=250) == []
    assert [entry.request for entry in held.due(1_250, after_ms=250)] == [first]
    assert held.due(1_300, after_ms=250) == []  # given back: no longer held here
    assert [entry.request for entry in held.due(1_350, after_ms=250)] == [second]
    assert len(held) == 0


def test_a_started_message_is_never_due() -> None:
    held = HeldMessages()
    request = _Request("t1")
    held.taken(request, now_ms=0)
    held.started(request)
    held.started(request)  # a second end (accepted, then failed) is harmless
    assert held.due(10_000, after_ms=250) == []


def test_two_copies_under_one_task_id_are_held_apart() -> None:
    # A message given back can come back to the worker that still holds its first copy.
    held = HeldMessages()
    copy, again = _Request("t1"), _Request("t1")
    held.taken(copy, now_ms=0)
    held.taken(again, now_ms=200)
    held.started(copy)
    assert [entry.request for entry in held.due(10_000, after_ms=0)] == [again]
