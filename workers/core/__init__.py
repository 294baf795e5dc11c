"""Pure domain code: no Celery, no Redis, no clock reads. Time comes in as ``now`` arguments."""

from workers.core.models import CallState, SyntheticReason, TextBlock, ToolCall, ToolResult
from workers.core.results import fallback_result, success_result, synthetic_result, tool_error_result

__all__ = [
    "CallState",
    "SyntheticReason",
    "TextBlock",
    "ToolCall",
    "ToolResult",
    "fallback_result",
    "success_result",
    "synthetic_result",
    "tool_error_result",
]
