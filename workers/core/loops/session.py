"""The per-call loop check, as the invoke path runs it: before dispatch and after the outcome.

:class:`LoopGuard` ties the pure pieces (hashing, detectors, post-compaction guard) to a
:class:`~workers.core.loops.history.LoopHistory`. With detection on, ``before_call`` costs
one history round trip (append + the window's signals); a blocked call costs a second (discard) and
an emitted-or-not warning a second (de-duplication). ``after_call`` costs one round trip
when there is anything to record; with detection and guard both off it costs none.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from workers.core.loops.config import LoopDetectionConfig
from workers.core.loops.detectors import Detector, Level, LoopVerdict, judge, warning_bucket
from workers.core.loops.guard import GuardTriple, guard_abort_count, guard_message
from workers.core.loops.hashing import UNDEFINED, hash_args, hash_outcome, normalize_tool_name
from workers.core.loops.history import HistoryEntry, LoopHistory, RunScope

__all__ = ["LoopGuard", "PendingCall"]


@dataclass(frozen=True)
class PendingCall:
    """A call that passed :meth:`LoopGuard.before_call`; hand it back to ``after_call``."""

    scope: RunScope
    tool: str
    args: Any
    args_hash: str
    tool_call_id: str | None
    verdict: LoopVerdict


class LoopGuard:
    """Runs the loop check of one agent's calls against a history store."""

    def __init__(self, history: LoopHistory, config: LoopDetectionConfig) -> None:
        self.history = history
        self.config = config

    def before_call(
        self, scope: RunScope, tool: str, args: Any, now_ms: int, tool_call_id: str | None = None
    ) -> PendingCall:
        """Judge a call before dispatch; a ``blocked`` verdict means it must not be executed."""
        name = normalize_tool_name(tool)
        args_hash = hash_args(name, args)
        pending = PendingCall(scope, name, args, args_hash, tool_call_id, LoopVerdict())
        config = self.config
        if not config.enabled:
            return pending
        entry = HistoryEntry(0, name, args_hash, tool_call_id, scope.run_id or None)
        signals, seq = self.history.check_call(
            scope, entry, config.history_size, config.critical_threshold, now_ms
        )
        verdict = judge(signals, tool=name, args=args, args_hash=args_hash, config=config)
        if verdict.level is Level.CRITICAL:
            # OpenClaw never records a blocked call, so a block stays sticky for identical retries.
            self.history.discard_call(scope, seq)
        elif verdict.level is Level.WARNING and verdict.warning_key is not None:
            key = f"{scope.run_id}:{verdict.warning_key}" if scope.run_id else verdict.warning_key
            emitted = self.history.note_warning(scope, key, warning_bucket(verdict.count), now_ms)
            verdict = replace(verdict, warning_emitted=emitted)
        return replace(pending, verdict=verdict)

    def after_call(
        self, pending: PendingCall, result: Any = UNDEFINED, *, is_error: bool = False, now_ms: int
    ) -> LoopVerdict | None:
        """Record an executed call's outcome; returns an abort verdict when a loop survived compaction."""
        config = self.config
        outcome = hash_outcome(
            pending.tool, pending.args, result, is_error=is_error, send_tools=config.send_tools
        )
        if outcome.result_hash is None:
            return None
        triple: GuardTriple | None = None
        if config.guard_enabled:
            triple = (pending.tool, pending.args_hash, outcome.result_hash)
        history_size = config.history_size if config.enabled else None
        if triple is None and history_size is None:
            return None
        entry = HistoryEntry(
            0,
            pending.tool,
            pending.args_hash,
            pending.tool_call_id,
            pending.scope.run_id or None,
            outcome.result_hash,
            outcome.unknown_tool_name,
        )
        window = self.history.record_outcome(pending.scope, entry, history_size, triple, now_ms)
        if window is None or triple is None:
            return None
        count = guard_abort_count(window, triple, config.guard_window_size)
        if count is None:
            return None
        return LoopVerdict(
            Level.CRITICAL,
            Detector.COMPACTION_LOOP_PERSISTED,
            count,
            guard_message(pending.tool, count, config.guard_window_size),
            abort_run=True,
        )

    def note_compaction(self, scope: RunScope, now_ms: int) -> bool:
        """Arm the post-compaction guard after a successful compaction; returns whether it is enabled."""
        if self.config.guard_enabled:
            self.history.arm_guard(scope, self.config.guard_window_size, now_ms)
        return self.config.guard_enabled
