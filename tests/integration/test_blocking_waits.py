"""A sync waiter learns its answer when it comes, not at its next check.

Two ways it did not: a ``BLPOP`` the socket gave up on first failed the wait as a store error
(and a done signal Redis popped just then went to the closed connection); and a signal another
waiter of the run popped twice was dropped. Both cost the waiter its next check (5 s in
``test_shared_run_wakeups``, on a loaded machine).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from workers.core.models import ToolCall
from workers.core.results import success_result
from workers.runtime import open_ledger
from workers.settings import Settings
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger
from workers.store.records import CallField

SOCKET_TIMEOUT_S = 0.4


@contextmanager
def _ledger(settings: Settings, socket_timeout_s: float | None = None) -> Iterator[Ledger]:
    if socket_timeout_s is not None:
        redis = settings.redis.model_copy(update={"socket_timeout_s": socket_timeout_s})
        settings = settings.model_copy(update={"redis": redis})
    ledger = open_ledger(settings)
    try:
        yield ledger
    finally:
        ledger.close()


def _registered(ledger: Ledger, keys: RunKeys, *call_ids: str) -> None:
    fields: dict[str, str] = {CallField.TOOL: "echo", CallField.DISPATCHED: "1"}
    for call_id in call_ids:
        assert ledger.register(keys, call_id, now_ms=1_000, deadline_ms=60_000, fields=fields)


def _answer(ledger: Ledger, keys: RunKeys, call_id: str, text: str) -> None:
    result = success_result(ToolCall(id=call_id, name="echo"), text, elapsed_ms=5, attempt=1)
    assert ledger.finish(keys, result, now_ms=2_000, writer="worker")


def test_a_wait_longer_than_the_socket_timeout_comes_back_empty_not_failed(settings: Settings) -> None:
    # Given a ledger whose socket gives up on a reply after 0.4 s
    with _ledger(settings, SOCKET_TIMEOUT_S) as ledger:
        keys = ledger.keys("blocking", "r1")
        # When a waiter asks to block for 2 s on a run with no signal
        started = time.monotonic()
        woken = ledger.wait_for_results(keys, 2.0, read=["c1"])
        # Then Redis was asked for less than the socket waits: no signal, and no store error
        assert woken is None
        assert time.monotonic() - started < SOCKET_TIMEOUT_S


def test_a_waiter_blocking_again_gets_an_answer_that_came_past_the_socket_timeout(settings: Settings) -> None:
    # Given a call of a run, and a ledger whose socket gives up after 0.4 s
    with _ledger(settings, SOCKET_TIMEOUT_S) as ledger:
        keys = ledger.keys("blocking", "r2")
        _registered(ledger, keys, "c1")
        # When the waiter blocks again and again, as the gateway's loop does, and the answer
        # comes once the socket timeout has passed
        started = time.monotonic()
        woken = None
        answered = False
        while woken is None and time.monotonic() - started < 5:
            woken = ledger.wait_for_results(keys, 2.0, mine={"c1"}, read=["c1"])
            if not answered and time.monotonic() - started > SOCKET_TIMEOUT_S:
                _answer(ledger, keys, "c1", "late")
                answered = True
        # Then its signal reached the waiter, with the answer
        assert woken is not None
        assert woken["c1"].text == "late"


def test_a_signal_another_waiter_popped_twice_still_reaches_its_own(settings: Settings) -> None:
    # Given two calls of one run, each waited for by its own waiter of this process, and
    # call a answered while its waiter was not blocked
    with _ledger(settings) as ledger:
        keys = ledger.keys("blocking", "r3")
        _registered(ledger, keys, "a", "b")
        _answer(ledger, keys, "a", "for a")
        # When b's waiter blocks twice first: it pops a's signal, hands it back once, pops it again
        for _ in range(2):
            assert ledger.wait_for_results(keys, 0.2, mine={"b"}, read=["b"]) == {}
        assert ledger.client.llen(keys.done) == 0  # a marked signal is never handed back twice
        # Then a's waiter still gets its answer at once, from what b's waiter kept for it
        started = time.monotonic()
        woken = ledger.wait_for_results(keys, 2.0, mine={"a"}, read=["a"])
        assert woken is not None
        assert woken["a"].text == "for a"
        assert time.monotonic() - started < 0.5
