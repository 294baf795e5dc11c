"""Waiting for a run's answers on a synchronous client: one ``BLPOP`` on the run's done list.

The winning finish pushes a signal that carries its result (:mod:`workers.store.done_signals`),
so a wait for one call reads nothing behind the pop. The async twin is
:class:`workers.store.done_listener.DoneListener`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import redis

from workers.core.models import ToolResult
from workers.store.connection import store_errors
from workers.store.done_signals import Signal
from workers.store.keys import RunKeys
from workers.store.ledger_args import done_expire_s
from workers.store.records import CallField

__all__ = ["wait_for_results"]


def wait_for_results(
    client: redis.Redis,
    keys: RunKeys,
    timeout_s: float,
    *,
    mine: Collection[str],
    read: Sequence[str],
    ttl_s: int,
) -> dict[str, ToolResult] | None:
    """Wait for the next done signal of ``keys``' run, then the delivered results among ``read``.

    None when no signal came within ``timeout_s``. The signal of the winning finish carries
    its result, so for one call nothing is read behind the ``BLPOP``: its own signal is its
    answer, and after any other the record is read in the round trip that may hand that
    signal back (see :meth:`workers.store.ledger.Ledger.wait_for_done` for ``mine``). For
    several calls the reads are pipelined behind the ``BLPOP`` on its connection, so Redis
    runs them the moment the signal is popped. ``ttl_s`` is the ledger's record TTL.
    """
    behind = read if len(read) > 1 else ()
    with store_errors():
        pipe = client.pipeline(transaction=False)
        pipe.blpop([keys.done], timeout=max(0.01, timeout_s))
        for call_id in behind:
            pipe.hget(keys.call(call_id), CallField.RESULT)
        popped, *raw = pipe.execute()
        if popped is None:
            return None
        signal = Signal.parse(str(popped[1]))
        answers = {cid: ToolResult.from_json(r) for cid, r in zip(behind, raw, strict=True) if r}
        if signal.call_id in read and (inline := signal.answer()) is not None:
            answers[signal.call_id] = inline
        follow = [] if behind else [cid for cid in read if cid not in answers]
        answers.update(_after_signal(client, keys, signal, mine, follow, ttl_s=ttl_s))
    return answers


def _after_signal(
    client: redis.Redis,
    keys: RunKeys,
    signal: Signal,
    mine: Collection[str],
    follow: Sequence[str],
    *,
    ttl_s: int,
) -> dict[str, ToolResult]:
    """Hand ``signal`` back if it is not for ``mine``, and read ``follow``: one round trip."""
    hand_back = bool(mine) and not signal.handed_back and signal.call_id not in mine
    if not hand_back and not follow:
        return {}
    pipe = client.pipeline(transaction=False)
    if hand_back:
        # The pop may have emptied (deleted) the list: a push that creates it sets its TTL.
        pipe.rpush(keys.done, signal.marked())
        pipe.expire(keys.done, done_expire_s(ttl_s))
    for call_id in follow:
        pipe.hget(keys.call(call_id), CallField.RESULT)
    replies = pipe.execute()
    raw = replies[len(replies) - len(follow) :]
    return {cid: ToolResult.from_json(r) for cid, r in zip(follow, raw, strict=True) if r}
