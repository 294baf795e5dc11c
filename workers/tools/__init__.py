"""Tool registry, loader and built-in tools (may do I/O; never imports Celery)."""

from workers.tools.context import ToolContext
from workers.tools.loader import load_tools
from workers.tools.registry import ToolSpec, get_tool, registered_tools, tool, validate_arguments

__all__ = [
    "ToolContext",
    "ToolSpec",
    "get_tool",
    "load_tools",
    "registered_tools",
    "tool",
    "validate_arguments",
]
