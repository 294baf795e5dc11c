"""Task messages a worker refuses to run, and the answer to a call whose message was refused.

A worker runs a message only when the gateway registered its call with exactly that job (see
:mod:`workers.core.job_digest`). Everything else is refused: it runs nothing, is logged with
its task id and counted by reason (``unstuck_refused_messages_total{reason}``), and when the
call it names exists and no live worker is running it, the call is answered
``call_mismatch`` so that no session waits for it.
"""

from __future__ import annotations

import enum

from workers.core.models import ClaimStatus, SyntheticReason, ToolCall, ToolResult
from workers.core.results import synthetic_result

__all__ = ["RefusalReason", "mismatch_result", "refusal_of"]


class RefusalReason(enum.StrEnum):
    """Why a worker refused a task message (the label of the refused-messages counter)."""

    UNDECODABLE = "undecodable"  # the consumer could not decode or verify the body (bad signature)
    UNTRUSTED_CONTENT = "untrusted_content"  # a content type the worker refuses (unsigned, with signing on)
    UNREADABLE = "unreadable"  # the body is not a CallJob
    UNREGISTERED = "unregistered"  # no registered call of that id in that run
    MISMATCH = "mismatch"  # the call exists, the message is not the job registered for it
    TOOL_NOT_ALLOWED = "tool_not_allowed"  # the worker's allow/deny lists refuse the tool


_REFUSED_CLAIMS = {
    ClaimStatus.UNREGISTERED: RefusalReason.UNREGISTERED,
    ClaimStatus.MISMATCH: RefusalReason.MISMATCH,
    ClaimStatus.MISMATCH_HELD: RefusalReason.MISMATCH,
}


def refusal_of(status: ClaimStatus) -> RefusalReason | None:
    """The refusal a claim's status means, None for a claim that is not a refusal."""
    return _REFUSED_CLAIMS.get(status)


def mismatch_result(call_id: str, registered_tool: str, *, elapsed_ms: int) -> ToolResult:
    """The answer to a registered call whose message did not match it; names the registered tool."""
    call = ToolCall(id=call_id, name=registered_tool or "unknown")
    return synthetic_result(call, SyntheticReason.CALL_MISMATCH, elapsed_ms=elapsed_ms, attempt=0)
