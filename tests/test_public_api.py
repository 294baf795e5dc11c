"""The supported names, locked: changing them is a deliberate edit of this file."""

from __future__ import annotations

import importlib

import pytest

EXPECTED = {
    "workers": [
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
    ],
    "workers.adapters.langgraph": ["UnstuckTool", "unstuck_tool_node", "unstuck_tools"],
    "workers.adapters.openai_agents": ["unstuck_function_tools", "unstuck_run_config"],
    "workers.core": [
        "CallState",
        "SyntheticReason",
        "TextBlock",
        "ToolCall",
        "ToolResult",
        "fallback_result",
        "success_result",
        "synthetic_result",
        "tool_error_result",
    ],
}


@pytest.mark.parametrize("module", sorted(EXPECTED))
def test_all_matches_the_checked_in_list(module: str) -> None:
    exported = importlib.import_module(module).__all__
    assert list(exported) == EXPECTED[module]


@pytest.mark.parametrize("module", sorted(EXPECTED))
def test_all_is_sorted(module: str) -> None:
    exported = list(importlib.import_module(module).__all__)
    assert exported == sorted(exported)


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, names in sorted(EXPECTED.items()) for n in names])
def test_every_name_is_importable(module: str, name: str) -> None:
    # `from <module> import <name>`
    namespace: dict[str, object] = {}
    exec(f"from {module} import {name}", namespace)
    assert namespace[name] is getattr(importlib.import_module(module), name)


def test_shared_names_are_the_same_objects() -> None:
    import workers
    import workers.core

    assert workers.ToolCall is workers.core.ToolCall
    assert workers.ToolResult is workers.core.ToolResult
