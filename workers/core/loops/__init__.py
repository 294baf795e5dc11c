"""Loop detection and the post-compaction guard: pure, with the history behind a protocol."""

from workers.core.loops.config import (
    LoopDetectionBlock,
    LoopDetectionConfig,
    merge_loop_blocks,
    parse_loop_block,
    resolve_loop_config,
)
from workers.core.loops.detectors import Detector, Level, LoopVerdict, evaluate, warning_bucket
from workers.core.loops.guard import GuardTriple
from workers.core.loops.hashing import UNDEFINED, OutcomeHash, hash_args, hash_outcome, normalize_tool_name
from workers.core.loops.history import HistoryEntry, InMemoryLoopHistory, LoopHistory, RunScope
from workers.core.loops.replay import compare_expectations, replay, verdict_to_json
from workers.core.loops.session import LoopGuard, PendingCall

__all__ = [
    "UNDEFINED",
    "Detector",
    "GuardTriple",
    "HistoryEntry",
    "InMemoryLoopHistory",
    "Level",
    "LoopDetectionBlock",
    "LoopDetectionConfig",
    "LoopGuard",
    "LoopHistory",
    "LoopVerdict",
    "OutcomeHash",
    "PendingCall",
    "RunScope",
    "compare_expectations",
    "evaluate",
    "hash_args",
    "hash_outcome",
    "merge_loop_blocks",
    "normalize_tool_name",
    "parse_loop_block",
    "replay",
    "resolve_loop_config",
    "verdict_to_json",
    "warning_bucket",
]
