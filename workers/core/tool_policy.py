"""Which tools an agent may call: allow and deny lists, decided from plain values.

A rule set is one ``allow`` list and one ``deny`` list, each of entries that are a tool
name, a group (``group:builtins``) or ``*`` (every tool). A policy is the global rules
(``tools.allow``/``tools.deny``) followed by the agent's own (``agents.list[].tools``). A
tool is allowed when every rule set allows it:

- an empty ``allow`` list allows every tool; a non-empty one allows only the tools it names;
- ``deny`` always wins over ``allow``;
- an agent's lists apply on top of the global ones, so they can only narrow them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = ["ALL_TOOLS", "BUILTIN_TOOLS", "GROUPS", "ToolPolicy", "ToolRules", "unknown_groups"]

BUILTIN_TOOLS: Final = ("exec", "http_fetch")
ALL_TOOLS: Final = "*"
GROUPS: Final[dict[str, tuple[str, ...]]] = {"group:builtins": BUILTIN_TOOLS}


def _matches(name: str, entries: Iterable[str]) -> bool:
    return any(entry in (ALL_TOOLS, name) or name in GROUPS.get(entry, ()) for entry in entries)


def unknown_groups(entries: Iterable[str]) -> list[str]:
    """Entries that look like a group (``group:…``) but name none we define."""
    return [entry for entry in entries if entry.startswith("group:") and entry not in GROUPS]


@dataclass(frozen=True)
class ToolRules:
    """One layer of rules: ``allow`` (empty: no allowlist) and ``deny``."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    def allows(self, name: str) -> bool:
        """Whether this layer lets ``name`` through (deny wins over allow)."""
        if _matches(name, self.deny):
            return False
        return not self.allow or _matches(name, self.allow)


@dataclass(frozen=True)
class ToolPolicy:
    """The rules of one agent: the global layer first, then the agent's own."""

    layers: tuple[ToolRules, ...] = ()

    @property
    def restricted(self) -> bool:
        """Whether any layer sets an allow or deny list."""
        return any(layer.allow or layer.deny for layer in self.layers)

    def allows(self, name: str) -> bool:
        """Whether the agent may call ``name``: every layer must let it through."""
        return all(layer.allows(name) for layer in self.layers)

    def filter(self, names: Sequence[str]) -> list[str]:
        """The names the agent may call, in their given order."""
        return [name for name in names if self.allows(name)]
