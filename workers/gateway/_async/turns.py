"""A provider's turn and a run's collection: the steps the gateway's two APIs share, written once.

``call_tools_in`` runs the calls of an assistant message in a provider's format and returns
the answer to append; ``collect`` gathers every call of a run after a gateway restart,
waiting for the live ones. Written once: the asyncio module is the source the sync one is
generated from (``make generate``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from workers import tracing
from workers.core.models import ToolResult
from workers.core.provider_calls import ProviderAnswer, ProviderTurn
from workers.errors import LoopDetected
from workers.gateway._async.waiter import AsyncWaiter
from workers.gateway.batch import Batch
from workers.tracing.spans import RecordReader

__all__ = ["call_tools_in", "collect"]


async def call_tools_in(
    call_tools: Callable[..., Awaitable[list[ToolResult]]],
    format: str,
    message: Any,
    *,
    session_key: str,
    run_id: str,
    agent_id: str,
    turn: int | None,
) -> ProviderAnswer:
    """Run the calls of ``message`` through ``call_tools``; the answer to append.

    Unreadable arguments and a loop abort (``aborted``, not raised) are the ``ProviderTurn``'s.

    Raises:
        ProviderFormatError: unknown format, or the message is not in its shape (``path``).
    """
    decoded = ProviderTurn.decode(format, message, turn=turn)
    if not decoded.parsed:
        return decoded.answer([])
    try:
        results = await call_tools(
            session_key=session_key, run_id=run_id, agent_id=agent_id, calls=decoded.calls
        )
    except LoopDetected as exc:
        return decoded.answer(exc)
    return decoded.answer(results)


async def collect(
    waiter: AsyncWaiter,
    session_key: str,
    run_id: str,
    *,
    undispatched_after_ms: int,
    reader: RecordReader | None,
) -> list[ToolResult]:
    """Results of every call of the run, waiting for the live ones (on ``waiter``'s ledger).

    Calls that can no longer finish (never dispatched, worker lost, past deadline) get their
    synthetic result; the rest are awaited up to their deadline plus grace. ``reader`` links
    each call's span to its own (None: no link).
    """
    ledger = waiter.ledger
    keys = ledger.keys(session_key, run_id)
    call_ids = await ledger.run_call_ids(keys)
    answers = await ledger.results(keys, call_ids)
    batch = Batch.collected(keys, call_ids, answers, await ledger.open_calls(keys, call_ids))
    batch.answers.update(await waiter.wait(batch, undispatched_after_ms=undispatched_after_ms))
    results = [batch.answers[cid] for cid in call_ids if cid in batch.answers]
    return tracing.collected(reader, session_key, run_id, results)
