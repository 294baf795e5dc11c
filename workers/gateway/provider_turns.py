"""One assistant message in a provider's format through the gateway: its calls run, its answer built.

A call whose arguments cannot be read (not JSON, not an object) is decoded as a
``RejectedCall`` and submitted with the others through the normal call path: it meets the
loop gate and the unknown-tool check like any call, and is then answered ``invalid_arguments``
at submission and recorded in the ledger, exactly like a call whose arguments fail the
tool's schema. Nothing is answered outside the gateway, so ``collect`` and the loop detector
see every call of the message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from workers.core.models import ToolCall, ToolResult
from workers.core.provider_calls import ProviderAnswer, decode_calls, provider_answer
from workers.errors import LoopDetected

__all__ = ["ACallTools", "CallTools", "aanswer_message", "answer_message"]

CallTools = Callable[..., list[ToolResult]]
"""``ToolGateway.call_tools``: ``(*, session_key, run_id, agent_id, calls) -> results``."""

ACallTools = Callable[..., Awaitable[list[ToolResult]]]
"""``ToolGateway.acall_tools``: the same, awaited."""


def answer_message(
    call_tools: CallTools,
    fmt: str,
    message: Any,
    session_key: str,
    run_id: str,
    agent_id: str = "main",
    turn: int | None = None,
) -> ProviderAnswer:
    """Decode ``message``, run its calls with ``call_tools`` and encode the answer in ``fmt``.

    A message without calls touches nothing (no run is opened). A loop abort does not raise:
    the answer's ``aborted`` says so and its results still hold one result per call. For
    Gemini calls without ids, ``turn`` is the index the Content gets in ``contents``: the ids
    are then the ones transcript repair gives those calls, and a later turn identical to this
    one is not mistaken for a resend of it (see ``decode_calls``).

    Raises:
        ProviderFormatError: unknown format, or the message is not in the format's shape.
    """
    parsed = decode_calls(fmt, message, turn=turn)
    if not parsed:
        return provider_answer(fmt, parsed, [])
    calls: Sequence[ToolCall] = [p.call for p in parsed]
    try:
        results = call_tools(session_key=session_key, run_id=run_id, agent_id=agent_id, calls=calls)
    except LoopDetected as exc:
        return provider_answer(fmt, parsed, exc.results, exc)
    return provider_answer(fmt, parsed, results)


async def aanswer_message(
    acall_tools: ACallTools,
    fmt: str,
    message: Any,
    session_key: str,
    run_id: str,
    agent_id: str = "main",
    turn: int | None = None,
) -> ProviderAnswer:
    """:func:`answer_message` with the calls run by an awaited ``acall_tools``."""
    parsed = decode_calls(fmt, message, turn=turn)
    if not parsed:
        return provider_answer(fmt, parsed, [])
    calls: Sequence[ToolCall] = [p.call for p in parsed]
    try:
        results = await acall_tools(session_key=session_key, run_id=run_id, agent_id=agent_id, calls=calls)
    except LoopDetected as exc:
        return provider_answer(fmt, parsed, exc.results, exc)
    return provider_answer(fmt, parsed, results)
