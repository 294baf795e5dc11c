"""OpenClaw's own tool calls, as its plugin reports them: ledger record and loop verdict.

``start`` records the call with its deadline (``openclaw.budgets_s``) and asks the loop
detector and the post-compaction guard, over the run's usual history, whether it may run;
``end`` records its outcome there, so the detectors see OpenClaw's calls like unstuck's own.
"""

from __future__ import annotations

from typing import Any

from workers.core.loops import LoopVerdict, PendingCall, RunScope, hash_args, normalize_tool_name
from workers.core.models import TextBlock, ToolCall, ToolResult
from workers.core.openclaw_calls import OpenClawCall, OpenClawCallState
from workers.gateway.loop_gate import LoopGate
from workers.settings import Settings
from workers.store.ledger import Ledger
from workers.store.loop_history import RedisLoopHistory
from workers.store.openclaw_calls import OpenClawCalls, StartedCall

__all__ = ["OpenClawGuard"]


class OpenClawGuard:
    """The HTTP door's side of the OpenClaw plugin."""

    def __init__(self, settings: Settings, ledger: Ledger) -> None:
        self._settings = settings
        self.calls = OpenClawCalls(ledger.client, prefix=ledger.prefix, ttl_s=ledger.ttl_s)
        self._loops = LoopGate(settings, RedisLoopHistory.on_ledger(ledger))

    def start(
        self, session_key: str, run_id: str, agent_id: str, tool: str, call_id: str, params: Any, now_ms: int
    ) -> dict[str, Any]:
        """Record the call; ``{"block", "message", "deadline_ms"}`` for the plugin."""
        pending = self._loops.before(
            session_key, run_id, agent_id, ToolCall(id=call_id, name=tool, arguments=_args(params)), now_ms
        )
        verdict = pending.verdict
        state = OpenClawCallState.BLOCKED if verdict.blocked else OpenClawCallState.OPEN
        deadline_ms = now_ms + int(self._settings.openclaw.budget_s(tool) * 1000)
        call = OpenClawCall(
            session_key, run_id, agent_id, tool, call_id, now_ms, deadline_ms, state,
            ended_ms=now_ms if verdict.blocked else None,
        )  # fmt: skip
        self.calls.start(call, params, pending.args_hash)
        return {
            "block": verdict.blocked,
            "message": verdict.message if verdict.blocked else None,
            "warning": verdict.message if verdict.warning_emitted else None,
            "deadline_ms": deadline_ms,
        }

    def end(
        self, session_key: str, call_id: str, *, is_error: bool, text: str, now_ms: int, running: bool = False
    ) -> dict[str, Any]:
        """Record the call's end and its outcome; ``{"ended", "abort"}`` (abort: the guard's message).

        A ``running`` exec went to the background: its process still runs, so the call stays
        open under its budget (the watchdog ends its tree, or finds it gone).
        """
        won = False
        if not running:
            state = OpenClawCallState.FAILED if is_error else OpenClawCallState.DONE
            won = self.calls.end(session_key, call_id, state, now_ms)
        call = self.calls.get(session_key, call_id)
        if call is None or call.state is OpenClawCallState.BLOCKED:
            return {"ended": won, "abort": None}
        abort = self._record_outcome(call, is_error=is_error, text=text, now_ms=now_ms)
        return {"ended": won, "abort": None if abort is None else abort.message}

    def _record_outcome(
        self, call: StartedCall, *, is_error: bool, text: str, now_ms: int
    ) -> LoopVerdict | None:
        pending = PendingCall(
            RunScope(call.session_key, call.run_id),
            normalize_tool_name(call.tool),
            _args(call.params),
            call.args_hash or hash_args(normalize_tool_name(call.tool), _args(call.params)),
            call.call_id,
            LoopVerdict(),
        )
        result = ToolResult(
            tool_call_id=call.call_id, tool_name=call.tool, content=(TextBlock(text=text),), is_error=is_error
        )
        return self._loops.after(call.agent_id, pending, result, now_ms)


def _args(params: Any) -> dict[str, Any]:
    """The call's arguments without the plugin's own marker (it differs per call)."""
    if not isinstance(params, dict):
        return {}
    env = params.get("env")
    if isinstance(env, dict) and "UNSTUCK_CALL_ID" in env:
        rest = {k: v for k, v in env.items() if k != "UNSTUCK_CALL_ID"}
        return {**params, "env": rest} if rest else {k: v for k, v in params.items() if k != "env"}
    return params
