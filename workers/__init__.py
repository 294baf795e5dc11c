"""unstuck: every tool call of an agent gets exactly one result, on time."""

from workers.core.models import ToolCall, ToolResult
from workers.errors import UnstuckError
from workers.gateway import ToolGateway
from workers.settings import Settings, load_settings
from workers.tools import ToolContext, tool

__all__ = [
    "Settings",
    "ToolCall",
    "ToolContext",
    "ToolGateway",
    "ToolResult",
    "UnstuckError",
    "load_settings",
    "tool",
]
