"""Load tools from configured modules and from the ``unstuck.tools`` entry-point group."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points

from workers.core.mcp_upstreams import Upstream
from workers.errors import ConfigError
from workers.tools.builtins import enable_builtins
from workers.tools.registry import ToolSpec, registered_tools
from workers.tools.upstreams import register_upstreams

__all__ = ["ENTRY_POINT_GROUP", "load_tools"]

ENTRY_POINT_GROUP = "unstuck.tools"


def load_tools(
    modules: Iterable[str],
    *,
    builtins: Iterable[str] = (),
    use_entry_points: bool = True,
    upstreams: Mapping[str, Upstream] | None = None,
) -> dict[str, ToolSpec]:
    """Import every tool module, register the enabled ``builtins``, and return the registry.

    Built-ins not in ``builtins`` are not registered (and unregistered if they were). Each of
    ``upstreams`` (``mcp.upstreams_file``) not listed yet in this process is started and its
    tools registered as ``<name>__<tool>``; one that cannot start is left out and logged.

    Raises:
        ConfigError: naming each module or entry point that does not import.
    """
    enable_builtins(builtins)
    problems: list[tuple[str, str]] = []
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any import failure becomes one clear start-up error
            problems.append((f"UNSTUCK_TOOL_MODULES: {module}", f"{type(exc).__name__}: {exc}"))
    if use_entry_points:
        for point in entry_points(group=ENTRY_POINT_GROUP):
            try:
                point.load()
            except Exception as exc:  # noqa: BLE001 - same: report, do not crash
                problems.append(
                    (f"entry point {ENTRY_POINT_GROUP}:{point.name}", f"{type(exc).__name__}: {exc}")
                )
    if problems:
        raise ConfigError(problems)
    if upstreams:
        register_upstreams(upstreams)
    return registered_tools()
