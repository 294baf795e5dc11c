"""Value types shared by the gateway, the workers and the pure domain code."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from workers.core.transcript.adapters import anthropic, gemini, openai_chat, openai_responses

__all__ = [
    "CallJob",
    "CallState",
    "ClaimStatus",
    "RetryPolicy",
    "SyntheticReason",
    "TextBlock",
    "ToolCall",
    "ToolResult",
]


class SyntheticReason(enum.StrEnum):
    """Why a result was written by unstuck instead of by the tool."""

    TIMEOUT_SOFT = "timeout_soft"
    TIMEOUT_HARD = "timeout_hard"
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"
    WORKER_LOST = "worker_lost"
    CRASHED = "crashed"
    OUT_OF_MEMORY = "out_of_memory"
    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_TOOL = "unknown_tool"
    TOOL_NOT_ALLOWED = "tool_not_allowed"
    DISPATCH_FAILED = "dispatch_failed"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    CANCELLED = "cancelled"
    TOOL_ERROR = "tool_error"
    LOOP_BLOCKED = "loop_blocked"
    RUN_ABORTED = "run_aborted"
    CIRCUIT_OPEN = "circuit_open"
    CALL_MISMATCH = "call_mismatch"
    STILL_RUNNING = "still_running"


class CallState(enum.StrEnum):
    """Life cycle of one call in the result ledger."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"


class ClaimStatus(enum.StrEnum):
    """What a worker's claim of a call found."""

    CLAIMED = "claimed"  # the claim is ours: run the tool
    DONE = "done"  # already answered: never run it again
    BUSY = "busy"  # another live worker holds the lease
    LOST = "lost"  # an earlier claim's lease lapsed, unanswered: run nothing, it is requeued or answered
    UNREGISTERED = "unregistered"  # no gateway registered this call: run nothing, nothing to answer
    MISMATCH = "mismatch"  # not the job the gateway registered: run nothing, answer the call
    MISMATCH_HELD = "mismatch_held"  # not the registered job, and a live worker runs the call: ignore it
    EXPIRED = "expired"  # the registered job past its deadline: run nothing, it is answered elsewhere


class ToolCall(BaseModel):
    """One tool call emitted by the model (unknown keys from model output are ignored)."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)
    arguments: dict[str, Any] = Field(default_factory=dict)


class TextBlock(BaseModel):
    """A text content block of a tool result."""

    model_config = ConfigDict(frozen=True)

    type: Literal["text"] = "text"
    text: str


class ToolResult(BaseModel):
    """One tool result in the neutral transcript form.

    Synthetic results carry ``details["synthetic"] is True`` and a ``details["reason"]``.
    """

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    role: Literal["toolResult"] = "toolResult"
    tool_call_id: str = Field(alias="toolCallId")
    tool_name: str = Field(alias="toolName")
    content: tuple[TextBlock, ...]
    is_error: bool = Field(alias="isError")
    details: dict[str, Any] = Field(default_factory=dict)

    @property
    def text(self) -> str:
        """All text blocks joined by newlines."""
        return "\n".join(block.text for block in self.content)

    @property
    def synthetic(self) -> bool:
        """Whether unstuck wrote this result in place of the tool."""
        return bool(self.details.get("synthetic"))

    @property
    def reason(self) -> str | None:
        """The synthetic reason, or None for a result the tool produced."""
        reason = self.details.get("reason")
        return str(reason) if reason is not None else None

    def to_neutral(self) -> dict[str, Any]:
        """The neutral JSON form with camelCase keys."""
        return self.model_dump(mode="json", by_alias=True)

    def to_json(self) -> str:
        """Compact JSON of the neutral form (what the ledger stores)."""
        return json.dumps(self.to_neutral(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> ToolResult:
        """Parse the ledger's JSON form."""
        return cls.model_validate_json(raw)

    # The provider forms come from the transcript adapters' encoders, so that a result has one
    # shape per provider whether it is handed over here, by the gateway or by transcript repair.

    def to_anthropic(self) -> dict[str, Any]:
        """An Anthropic Messages ``tool_result`` content block."""
        return anthropic.result_block(self.to_neutral(), self.tool_call_id)

    def to_openai(self) -> dict[str, Any]:
        """An OpenAI Chat Completions ``role: tool`` message."""
        return openai_chat.tool_message(self.to_neutral(), self.tool_call_id)

    def to_openai_responses(self) -> dict[str, Any]:
        """An OpenAI Responses ``function_call_output`` item."""
        return openai_responses.output_item(self.to_neutral(), self.tool_call_id)

    def to_gemini(self, *, send_id: bool = True) -> dict[str, Any]:
        """A Gemini ``functionResponse`` part (without ``id`` when ``send_id`` is False)."""
        return gemini.response_part(self.to_neutral(), self.tool_name, self.tool_call_id if send_id else None)


# --- a tool's retry policy: attempts and backoff inside its time budget ---------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How often a failing tool is re-run inside its time budget.

    ``attempts`` counts the first run. A failure is retried when its exception class is
    listed in ``retry_on`` or it carries ``retryable = True``.
    """

    attempts: int = 1
    backoff_s: float = 0.5
    multiplier: float = 2.0
    max_backoff_s: float = 10.0
    retry_on: tuple[type[BaseException], ...] = ()
    #: Exception class names retried too, matched along the class's bases (``tools.retry`` in
    #: config cannot name classes): ``("Exception",)`` retries every failure.
    retry_on_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.backoff_s < 0 or self.max_backoff_s < 0 or self.multiplier < 1:
            raise ValueError("backoff must be >= 0 and multiplier >= 1")

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        """Whether ``error`` on attempt number ``attempt`` (1-based) earns another attempt."""
        if attempt >= self.attempts:
            return False
        if isinstance(error, self.retry_on) or bool(getattr(error, "retryable", False)):
            return True
        return any(cls.__name__ in self.retry_on_names for cls in type(error).__mro__)

    def delay_s(self, attempt: int) -> float:
        """Backoff before attempt ``attempt + 1``."""
        return float(min(self.max_backoff_s, self.backoff_s * self.multiplier ** (attempt - 1)))


class CallJob(BaseModel):
    """The body of one invoke task message (JSON). Unknown fields are refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_key: str = Field(min_length=1, max_length=512)
    run_id: str = Field(min_length=1, max_length=512)
    agent_id: str = Field(default="main", max_length=256)
    call: ToolCall
    submitted_ms: int
    deadline_ms: int
    soft_s: float = Field(gt=0)
    hard_s: float = Field(gt=0)
    heartbeat_s: float | None = None
