"""The HTTP door's request and response bodies, and the two JSON responses every route shares."""

from __future__ import annotations

from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

__all__ = [
    "Abort",
    "CallsAnswer",
    "CancelBody",
    "CompactionBody",
    "EndBody",
    "Format",
    "HeartbeatBody",
    "RepairBody",
    "ToolCallsBody",
    "answer_response",
    "error_response",
]

Format = Literal["neutral", "anthropic", "openai-chat", "openai-responses", "gemini"]


class ToolCallsBody(BaseModel):
    """One assistant message whose tool calls are to run."""

    agent_id: str = Field("main", min_length=1, max_length=200)
    format: Format = "neutral"
    message: Any = Field(..., description="the assistant message as the provider returned it")


class EndBody(BaseModel):
    """How the run ended."""

    status: Literal["completed", "aborted", "timed_out"] = "completed"


class HeartbeatBody(BaseModel):
    """What the agent is doing (a short label)."""

    agent_id: str = Field("main", min_length=1, max_length=200)
    what: str = Field("model", max_length=64)


class CancelBody(BaseModel):
    """Which call to cancel; none: every unanswered call of the run."""

    call_id: str | None = Field(None, min_length=1, max_length=256)


class CompactionBody(BaseModel):
    """Which agent compacted its context."""

    agent_id: str = Field("main", min_length=1, max_length=200)


class RepairBody(BaseModel):
    """A transcript to repair."""

    format: Format = "neutral"
    transcript: Any
    provider: str | None = None
    model_api: str | None = None
    model_id: str | None = None


class Abort(BaseModel):
    """Why the run was aborted (by the loop detector)."""

    reason: str
    detector: str | None = None


class CallsAnswer(BaseModel):
    """One result per call in call order, what to append in the request's format, and any abort."""

    results: list[dict[str, Any]]
    append: Any
    aborted: Abort | None = None


def answer_response(answer: dict[str, Any]) -> JSONResponse:
    """A ``CallsAnswer`` already in JSON form (the hot path: no second validation of the results)."""
    aborted = answer["aborted"]
    if aborted is not None:
        aborted = {"reason": aborted["reason"], "detector": aborted.get("detector")}
    return JSONResponse({"results": answer["results"], "append": answer["append"], "aborted": aborted})


def error_response(status: int, kind: str, message: str) -> JSONResponse:
    """The error body of every route: ``{"error": {"type", "message"}}``."""
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status)
