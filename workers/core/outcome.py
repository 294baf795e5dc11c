"""What a call's one result means for monitoring: its task's final state, reason and summary.

Flower shows Celery task states, so each call's task must end in the state its result
deserves: ``SUCCESS`` only for a tool's own successful result, ``REVOKED`` for a call that
was withdrawn (``cancelled``, ``run_aborted``), ``FAILURE`` for everything else, a declared
fallback included (the tool still failed). The same summary is the invoke task's return
value, the failure's ``info`` and the ``result`` field of the events that close a task, so
Flower's search finds a call by its reason as well as by session, run, call id and tool.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from workers.core.models import SyntheticReason, ToolResult
from workers.core.redact import redact
from workers.errors import CallFailed

__all__ = ["CALL_FAILURES", "CallOutcome", "TaskState", "closing_event", "failure_event", "outcome_of"]

_MESSAGE_CHARS = 500
_REVOKED = frozenset({SyntheticReason.CANCELLED.value, SyntheticReason.RUN_ABORTED.value})

# Two reasons keep names of their own in Flower: their CamelCase would be the name of the
# error the gateway raises (InvalidArguments), or say less than the tool failed (ToolError).
_CLASS_NAMES = {
    SyntheticReason.TOOL_ERROR: "ToolFailed",
    SyntheticReason.INVALID_ARGUMENTS: "ArgumentsInvalid",
}


def _failure_class(reason: SyntheticReason) -> type[CallFailed]:
    name = _CLASS_NAMES.get(reason) or "".join(word.capitalize() for word in reason.split("_"))
    doc = f"A call answered ``{reason.value}``: its task's exception, the class name Flower shows."
    return type(name, (CallFailed,), {"reason": reason.value, "__doc__": doc, "__module__": __name__})


CALL_FAILURES: dict[str, type[CallFailed]] = {r.value: _failure_class(r) for r in SyntheticReason}
"""The :class:`CallFailed` subclass of each reason (``details.reason`` of a result)."""

# Module attributes too, so pickle finds each class by name: the pool child sends the
# exception to the worker's main process, which builds the task's closing event from it.
globals().update({cls.__name__: cls for cls in CALL_FAILURES.values()})


class TaskState(enum.StrEnum):
    """The Celery state a call's task ends in."""

    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    REVOKED = "REVOKED"


@dataclass(frozen=True)
class CallOutcome:
    """A result reduced to what an operator needs: outcome, reason, timing, and a one-line text."""

    tool: str
    outcome: str  # ok | error (the tool raised) | synthetic (unstuck answered) | fallback
    reason: str | None
    elapsed_ms: int
    attempt: int
    text: str  # what the model was told, as stored
    loop_warning: dict[str, Any] | None = None

    @property
    def state(self) -> TaskState:
        """``SUCCESS`` for a tool's success, ``REVOKED`` for a withdrawn call, else ``FAILURE``."""
        if self.outcome == "ok":
            return TaskState.SUCCESS
        return TaskState.REVOKED if self.reason in _REVOKED else TaskState.FAILURE

    def info(self) -> dict[str, Any]:
        """``{outcome, reason, elapsed_ms, attempt, loop_warning?}``: the task's result or failure info."""
        info: dict[str, Any] = {
            "outcome": self.outcome,
            "reason": self.reason,
            "elapsed_ms": self.elapsed_ms,
            "attempt": self.attempt,
        }
        if self.loop_warning:
            info["loop_warning"] = self.loop_warning
        return info

    def failure(self) -> CallFailed:
        """The exception of a failed or withdrawn call: its class names the reason, its message the text."""
        cls = CALL_FAILURES.get(self.reason or "", CallFailed)
        prefix = "fallback delivered after " if self.outcome == "fallback" else ""
        return cls(f"{prefix}{self.reason or 'error'}: {self.summary}", self.info())

    @property
    def summary(self) -> str:
        """The text on one line, secrets masked, at most 500 characters (built only for failures)."""
        # Cut well past the limit first: masking a 256 KiB result would cost every call.
        text = " ".join(redact(self.text[: _MESSAGE_CHARS * 16]).split())
        return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 3] + "..."


def outcome_of(result: ToolResult, loop_warning: dict[str, Any] | None = None) -> CallOutcome:
    """The outcome of ``result``; ``loop_warning`` is the detector's warning when one was given."""
    details = result.details
    if details.get("fallback"):
        outcome = "fallback"
    elif result.synthetic:
        outcome = "synthetic"
    else:
        outcome = "error" if result.is_error else "ok"
    return CallOutcome(
        tool=result.tool_name,
        outcome=outcome,
        reason=result.reason,
        elapsed_ms=int(details.get("elapsed_ms", 0)),
        attempt=int(details.get("attempt", 0)),
        text=result.text,
        loop_warning=loop_warning or details.get("loop_warning"),
    )


_EVENT_TYPES = {
    TaskState.SUCCESS: "task-succeeded",
    TaskState.FAILURE: "task-failed",
    TaskState.REVOKED: "task-revoked",
}


def closing_event(outcome: CallOutcome) -> tuple[str, dict[str, Any]]:
    """The Celery task event (type, fields) that ends a call's task in the state of ``outcome``.

    Every event carries ``result`` (the outcome's info), the field Flower's search reads;
    failures and revocations also carry the exception's repr and an empty traceback.
    """
    if outcome.state is TaskState.SUCCESS:
        return _EVENT_TYPES[TaskState.SUCCESS], {"result": repr(outcome.info())}
    return failure_event(outcome.failure())


def failure_event(failure: CallFailed) -> tuple[str, dict[str, Any]]:
    """The event (type, fields) ending a task with ``failure``: ``task-revoked`` or ``task-failed``."""
    state = TaskState.REVOKED if failure.reason in _REVOKED else TaskState.FAILURE
    fields: dict[str, Any] = {"result": repr(failure.info), "exception": repr(failure), "traceback": ""}
    if state is TaskState.REVOKED:
        fields.update(terminated=False, signum=None, expired=False)
    return _EVENT_TYPES[state], fields
