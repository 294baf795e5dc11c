"""unstuck: every tool call of an agent gets exactly one result, on time.

The names below are loaded on first use (PEP 562), so ``import workers.core`` stays pure:
importing a subpackage does not pull in the gateway, Celery or Redis.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.core.models import RetryPolicy, ToolCall, ToolResult
    from workers.core.provider_calls import ProviderAnswer
    from workers.errors import ToolExecutionError, UnstuckError
    from workers.gateway.client import ToolGateway
    from workers.gateway.idle_guard import aidle_guard, idle_guard
    from workers.settings import Settings, load_settings
    from workers.tools import ToolContext, tool

__all__ = [
    "ProviderAnswer",
    "RetryPolicy",
    "Settings",
    "ToolCall",
    "ToolContext",
    "ToolExecutionError",
    "ToolGateway",
    "ToolResult",
    "UnstuckError",
    "aidle_guard",
    "idle_guard",
    "load_settings",
    "tool",
]

_HOMES = {
    "ProviderAnswer": "workers.core.provider_calls",
    "RetryPolicy": "workers.core.models",
    "Settings": "workers.settings",
    "ToolCall": "workers.core.models",
    "ToolContext": "workers.tools",
    "ToolExecutionError": "workers.errors",
    "ToolGateway": "workers.gateway.client",
    "ToolResult": "workers.core.models",
    "UnstuckError": "workers.errors",
    "aidle_guard": "workers.gateway.idle_guard",
    "idle_guard": "workers.gateway.idle_guard",
    "load_settings": "workers.settings",
    "tool": "workers.tools",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'workers' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
