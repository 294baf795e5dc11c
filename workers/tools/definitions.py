"""Tool definitions for the model, in each provider's format, from the registry's argument schemas.

================  ============================================================================
format            one entry per tool
================  ============================================================================
neutral           ``{name, description, parameters}``
anthropic         ``{name, description, input_schema}``
openai-chat       ``{type: "function", function: {name, description, parameters}}``
openai-responses  ``{type: "function", name, description, parameters, strict: false}``
gemini            one ``{functionDeclarations: [{name, description, parametersJsonSchema}]}``
================  ============================================================================

Each list is what the provider's request takes as ``tools``. The Responses API enforces strict
schemas unless told otherwise, and strict schemas may not have optional parameters, so
``strict`` is false. Gemini gets the JSON Schema in ``parametersJsonSchema``: its older
``parameters`` field takes an OpenAPI subset that refuses ``additionalProperties``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from workers.core.provider_calls import check_format
from workers.core.tool_policy import ToolPolicy
from workers.tools.registry import ToolSpec, get_tool, registered_tools

__all__ = ["parameters_schema", "tool_definitions"]


def parameters_schema(spec: ToolSpec) -> dict[str, Any]:
    """The JSON Schema of a tool's arguments (the one its calls are validated against)."""
    if spec.input_schema is not None:
        return dict(spec.input_schema)
    schema = spec.arguments_model.model_json_schema()
    schema.pop("title", None)  # the internal model's name, not something the model should see
    return schema


def tool_definitions(
    fmt: str = "neutral", *, names: Sequence[str] | None = None, policy: ToolPolicy | None = None
) -> list[dict[str, Any]]:
    """The definitions of the registered tools (or of ``names``, in that order) in ``fmt``.

    Without ``names`` every registered tool is listed, sorted by name (the enabled built-ins
    included). With ``policy``, only the tools it allows are listed.

    Raises:
        ProviderFormatError: the format is unknown.
        ToolNotFound: a name in ``names`` is not registered.
    """
    check_format(fmt)
    specs = [get_tool(name) for name in names] if names is not None else _sorted(registered_tools())
    if policy is not None:
        specs = [spec for spec in specs if policy.allows(spec.name)]
    neutral = [
        {"name": spec.name, "description": spec.description, "parameters": parameters_schema(spec)}
        for spec in specs
    ]
    if fmt == "anthropic":
        return [
            {"name": d["name"], "description": d["description"], "input_schema": d["parameters"]}
            for d in neutral
        ]
    if fmt == "openai-chat":
        return [{"type": "function", "function": d} for d in neutral]
    if fmt == "openai-responses":
        return [{"type": "function", **d, "strict": False} for d in neutral]
    if fmt == "gemini":
        declarations = [
            {"name": d["name"], "description": d["description"], "parametersJsonSchema": d["parameters"]}
            for d in neutral
        ]
        return [{"functionDeclarations": declarations}] if declarations else []
    return neutral


def _sorted(specs: dict[str, ToolSpec]) -> list[ToolSpec]:
    return [specs[name] for name in sorted(specs)]
