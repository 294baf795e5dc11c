"""Tool definitions for the model in each provider's format, from the registry's schemas."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest

from workers.core.provider_calls import FORMATS
from workers.core.tool_policy import ToolPolicy, ToolRules
from workers.errors import InvalidArguments, ProviderFormatError, ToolNotFound
from workers.tools import registry
from workers.tools.definitions import parameters_schema, tool_definitions
from workers.tools.registry import get_tool, tool, validate_arguments


@pytest.fixture(autouse=True)
def _only_these_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    # A registry of two tools, whatever else this process registered
    monkeypatch.setattr(registry, "_REGISTRY", {})

    @tool
    def search(query: str, ctx: Any, limit: int = 5, mode: Literal["fast", "deep"] = "fast") -> list[str]:
        """Search the docs.

        Only the first line is the description.
        """
        return []

    @tool(name="clock", description="What time it is")
    def clock_tool() -> str:
        return "now"


SEARCH_SCHEMA = {
    "additionalProperties": False,
    "properties": {
        "query": {"title": "Query", "type": "string"},
        "limit": {"default": 5, "title": "Limit", "type": "integer"},
        "mode": {"default": "fast", "enum": ["fast", "deep"], "title": "Mode", "type": "string"},
    },
    "required": ["query"],
    "type": "object",
}
CLOCK_SCHEMA = {"additionalProperties": False, "properties": {}, "type": "object"}

EXPECTED: dict[str, list[dict[str, Any]]] = {
    "neutral": [
        {"name": "clock", "description": "What time it is", "parameters": CLOCK_SCHEMA},
        {"name": "search", "description": "Search the docs.", "parameters": SEARCH_SCHEMA},
    ],
    "anthropic": [
        {"name": "clock", "description": "What time it is", "input_schema": CLOCK_SCHEMA},
        {"name": "search", "description": "Search the docs.", "input_schema": SEARCH_SCHEMA},
    ],
    "openai-chat": [
        {
            "type": "function",
            "function": {"name": "clock", "description": "What time it is", "parameters": CLOCK_SCHEMA},
        },
        {
            "type": "function",
            "function": {"name": "search", "description": "Search the docs.", "parameters": SEARCH_SCHEMA},
        },
    ],
    "openai-responses": [
        {
            "type": "function",
            "name": "clock",
            "description": "What time it is",
            "parameters": CLOCK_SCHEMA,
            "strict": False,
        },
        {
            "type": "function",
            "name": "search",
            "description": "Search the docs.",
            "parameters": SEARCH_SCHEMA,
            "strict": False,
        },
    ],
    "gemini": [
        {
            "functionDeclarations": [
                {"name": "clock", "description": "What time it is", "parametersJsonSchema": CLOCK_SCHEMA},
                {"name": "search", "description": "Search the docs.", "parametersJsonSchema": SEARCH_SCHEMA},
            ]
        }
    ],
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_lists_every_tool_sorted_by_name(fmt: str) -> None:
    # When
    definitions = tool_definitions(fmt)
    # Then
    assert definitions == EXPECTED[fmt]
    assert json.loads(json.dumps(definitions)) == definitions


def test_the_schema_is_the_one_calls_are_validated_against() -> None:
    # Given
    spec = get_tool("search")
    schema = parameters_schema(spec)
    # Then ctx is not a parameter, and what the schema refuses the validation refuses
    assert "ctx" not in schema["properties"]
    assert validate_arguments(spec, {"query": "q"}) == {"query": "q", "limit": 5, "mode": "fast"}
    with pytest.raises(InvalidArguments):
        validate_arguments(spec, {"query": "q", "extra": 1})  # additionalProperties: false
    with pytest.raises(InvalidArguments):
        validate_arguments(spec, {"query": "q", "mode": "slow"})  # enum


def test_names_pick_tools_in_the_given_order() -> None:
    assert [d["name"] for d in tool_definitions("anthropic", names=["search", "clock"])] == [
        "search",
        "clock",
    ]
    assert tool_definitions("gemini", names=[]) == []
    with pytest.raises(ToolNotFound):
        tool_definitions("neutral", names=["serch"])


def test_an_unknown_format_lists_the_valid_ones() -> None:
    with pytest.raises(ProviderFormatError, match="valid formats: neutral, anthropic, openai-chat"):
        tool_definitions("claude")


def test_a_policy_lists_only_the_tools_it_allows() -> None:
    # Given an allowlist naming one of the registered tools and one nobody registered
    policy = ToolPolicy((ToolRules(allow=("search", "nothing_zq")),))
    # Then only the allowed, registered tool is listed, also among picked names
    assert [d["name"] for d in tool_definitions("neutral", policy=policy)] == ["search"]
    assert [d["name"] for d in tool_definitions("neutral", names=["clock", "search"], policy=policy)] == [
        "search"
    ]
    assert tool_definitions("gemini", policy=ToolPolicy((ToolRules(deny=("*",)),))) == []
