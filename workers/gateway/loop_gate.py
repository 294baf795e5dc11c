"""Loop detection in the gateway's call path: judge before dispatch, record after the result.

Critical verdicts answer the call with a ``loop_blocked`` synthetic result and nothing runs;
warnings let the call run and append the warning to the text the model sees (OpenClaw
system only logs it). A loop that survives context compaction, or the opt-in run-wide
breaker, aborts the run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import cache
from typing import Any

from workers.core.loops import (
    Detector,
    LoopDetectionConfig,
    LoopGuard,
    LoopHistory,
    LoopVerdict,
    PendingCall,
    RunScope,
)
from workers.core.loops.config import agent_path, resolve_loop_config
from workers.core.models import SyntheticReason, TextBlock, ToolCall, ToolResult
from workers.core.results import synthetic_result
from workers.settings import Settings

__all__ = ["LoopGate", "detector_outcome"]

log = logging.getLogger(__name__)

# Our own bookkeeping in result details; volatile, so never part of an outcome's identity.
_BOOKKEEPING = frozenset({"synthetic", "elapsed_ms", "attempt", "fallback", "loop_warning"})


def detector_outcome(result: ToolResult) -> tuple[Any, bool]:
    """The (result, is_error) pair the outcome hashing rules expect."""
    if result.is_error:
        return result.text, True
    details = {k: v for k, v in result.details.items() if k not in _BOOKKEEPING}
    if result.tool_name == "exec":
        details = _exec_details(result.text) or details
    return {"content": [{"type": "text", "text": result.text}], "details": details}, False


def _exec_details(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or "exit_code" not in value:
        return None
    output = f"{value.get('stdout', '')}{value.get('stderr', '')}"
    status = "completed" if value["exit_code"] == 0 else "failed"
    return {"status": status, "exitCode": value["exit_code"], "aggregated": output}


class LoopGate:
    """Per-gateway loop checks backed by a per-run history (the gateway's is in Redis)."""

    def __init__(
        self,
        settings: Settings,
        history: LoopHistory,
        *,
        emit: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self._settings = settings
        self._history = history
        self._emit = emit
        self._config = cache(self._resolve)

    def _resolve(self, agent_id: str) -> LoopDetectionConfig:
        profile = self._settings.agents.for_agent(agent_id)
        index = next((i for i, e in enumerate(self._settings.agents.list) if e.id == agent_id), None)
        return resolve_loop_config(
            self._settings.tools.loop_detection,
            profile.tools.loop_detection,
            agent_block_path=agent_path(index),
        )

    def detects(self, agent_id: str) -> bool:
        """Whether loop detection is on for ``agent_id`` (an armed compaction guard records outcomes too)."""
        return self._config(agent_id).enabled

    def guard(self, agent_id: str) -> LoopGuard:
        """The guard with ``agent_id``'s merged configuration."""
        return LoopGuard(self._history, self._config(agent_id))

    def before(
        self, session_key: str, run_id: str, agent_id: str, call: ToolCall, now_ms: int
    ) -> PendingCall:
        """Judge ``call`` before it is dispatched."""
        scope = RunScope(session_key, run_id)
        pending = self.guard(agent_id).before_call(scope, call.name, call.arguments, now_ms, call.id)
        verdict = pending.verdict
        if verdict.warning_emitted or verdict.blocked:
            self._announce(scope, call, verdict)
        return pending

    def blocked_result(self, call: ToolCall, verdict: LoopVerdict) -> ToolResult:
        """The answer to a call the detector refused to run."""
        return synthetic_result(
            call,
            SyntheticReason.LOOP_BLOCKED,
            elapsed_ms=0,
            attempt=0,
            detail=verdict.message,
            extra={"detector": _name(verdict.detector), "count": verdict.count},
        )

    def warning_of(self, verdict: LoopVerdict | None) -> dict[str, Any] | None:
        """The detector's warning about a call that still runs (shown in Flower), or None."""
        if verdict is None or verdict.level.value != "warning" or not verdict.message:
            return None
        return {"detector": _name(verdict.detector), "count": verdict.count}

    def with_warning(self, result: ToolResult, verdict: LoopVerdict) -> ToolResult:
        """``result`` with the detector's warning appended to what the model sees."""
        warning = self.warning_of(verdict)
        if warning is None:
            return result
        return result.model_copy(
            update={
                "content": (*result.content, TextBlock(text=f"[unstuck loop warning] {verdict.message}")),
                "details": {**result.details, "loop_warning": warning},
            }
        )

    def after(
        self, agent_id: str, pending: PendingCall, result: ToolResult, now_ms: int
    ) -> LoopVerdict | None:
        """Record the outcome; returns an abort verdict when the run must stop."""
        value, is_error = detector_outcome(result)
        abort = self.guard(agent_id).after_call(pending, value, is_error=is_error, now_ms=now_ms)
        if abort is not None:
            self._announce(pending.scope, ToolCall(id=result.tool_call_id, name=result.tool_name), abort)
        return abort

    def note_compaction(self, session_key: str, run_id: str, agent_id: str, now_ms: int) -> bool:
        """Arm the post-compaction guard; returns whether it is enabled for the agent."""
        return self.guard(agent_id).note_compaction(RunScope(session_key, run_id), now_ms)

    def _announce(self, scope: RunScope, call: ToolCall, verdict: LoopVerdict) -> None:
        fields = {
            "session_key": scope.session_key,
            "run_id": scope.run_id,
            "call_id": call.id,
            "tool": call.name,
            "level": verdict.level.value,
            "detector": _name(verdict.detector),
            "count": verdict.count,
            "message": verdict.message,
        }
        log.warning("loop %s: %s", verdict.level.value, json.dumps(fields, sort_keys=True))
        if self._emit is not None:
            self._emit("unstuck-loop-" + verdict.level.value, fields)


def _name(detector: Detector | None) -> str | None:
    return None if detector is None else str(detector.value)
