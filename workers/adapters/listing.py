"""What every adapter builds its framework's tools from: the registered tools an agent may call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.gateway.client import ToolGateway

__all__ = ["ListedTool", "listed_tools"]


def _no_parameters() -> dict[str, Any]:
    return {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ListedTool:
    """One tool as a framework declares it: its name, a description (never empty), a JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=_no_parameters)

    @classmethod
    def of(cls, definition: dict[str, Any]) -> ListedTool:
        """From a neutral tool definition (``ToolGateway.tool_definitions``)."""
        name = str(definition["name"])
        return cls(
            name, definition.get("description") or name, definition.get("parameters") or _no_parameters()
        )


def listed_tools(gateway: ToolGateway, *, agent_id: str, names: Sequence[str] | None) -> list[ListedTool]:
    """The registered tools (or ``names``) that ``agent_id`` may call."""
    return [ListedTool.of(d) for d in gateway.tool_definitions("neutral", names=names, agent_id=agent_id)]
