"""Per-provider transcript policy, resolved from provider, model API and model id.

Unlike OpenClaw, every provider gets pairing repair with synthetic results by
default, OpenAI included: an unanswered call is rejected by all of them. With
``allow_synthetic_tool_results`` false, repair inserts none and removes unanswered calls instead.

Every field acts (the pipeline reads it); OpenClaw's ``preserveSignatures`` has no
field, as repair never strips a valid signature. Id rules follow the provider, not the id's
origin: native Kimi ids survive ``strict`` except for Anthropic, and the Responses APIs get the
``responses`` id mode (unique ``call_id``s of at most 64 characters, valid item ids).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from workers.core.transcript.ids import IdMode
from workers.core.transcript.model import DEFAULT_MISSING_TEXT
from workers.core.transcript.pairing import ErroredTurns
from workers.errors import ConfigError

__all__ = ["RESPONSES_APIS", "TranscriptPolicy", "resolve_policy"]

RESPONSES_APIS: Final = frozenset(
    {"openai-responses", "openai-codex-responses", "azure-openai-responses", "openai-chatgpt-responses"}
)
_OPENAI_APIS: Final = frozenset({"openai", "openai-completions"}) | RESPONSES_APIS
_OPENAI_PROVIDERS: Final = frozenset({"openai", "openai-codex", "azure-openai", "azure-openai-responses"})
_ANTHROPIC_APIS: Final = frozenset({"anthropic-messages", "bedrock-converse-stream"})
_ANTHROPIC_PROVIDERS: Final = frozenset({"anthropic", "amazon-bedrock", "anthropic-vertex"})
_GOOGLE_APIS: Final = frozenset({"google-generative-ai", "google-gemini-cli", "google-vertex"})
_GOOGLE_PROVIDERS: Final = frozenset({"google", "google-gemini-cli", "google-vertex", "google-antigravity"})
_MISTRAL_MARKERS: Final = ("mistral", "mixtral", "codestral", "pixtral", "devstral", "ministral")
_PASSTHROUGH_PROVIDERS: Final = frozenset({"openrouter", "opencode", "kilocode"})
_MINIMAX_PROVIDERS: Final = frozenset({"minimax", "minimax-cn"})


class TranscriptPolicy(BaseModel):
    """How to repair a transcript before it is replayed to one provider."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sanitize_mode: Literal["images-only", "full"] = "images-only"
    sanitize_tool_call_ids: bool = False
    tool_call_id_mode: IdMode | None = None
    preserve_native_anthropic_tool_use_ids: bool = False
    preserve_native_kimi_tool_call_ids: bool = True
    repair_tool_use_result_pairing: bool = True
    allow_synthetic_tool_results: bool = True
    errored_turns: ErroredTurns = "drop"
    missing_tool_result_text: str = DEFAULT_MISSING_TEXT
    drop_thinking_blocks: bool = False
    sanitize_thought_signatures: bool = False
    validate_anthropic_turns: bool = False
    validate_gemini_turns: bool = False
    apply_google_turn_ordering: bool = False


def resolve_policy(
    provider: str | None = None,
    model_api: str | None = None,
    model_id: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> TranscriptPolicy:
    """The policy for one provider / model API / model id, with ``overrides`` applied last.

    Raises:
        ConfigError: an override names an unknown field or has a value of the wrong type.
    """
    provider_key = (provider or "").strip().lower()
    api = (model_api or "").strip().lower()
    model = (model_id or "").strip().lower()
    fields: dict[str, Any] = {}
    if _is_anthropic(provider_key, api):
        fields |= _anthropic()
    elif _is_google(provider_key, api):
        fields |= _google()
    elif _is_openai(provider_key, api):
        fields |= _openai(api)
    else:
        fields |= _fallback(provider_key, api, model)
    if api in RESPONSES_APIS:
        fields["missing_tool_result_text"] = "aborted"
        if not fields.get("sanitize_tool_call_ids"):
            fields |= {"sanitize_tool_call_ids": True, "tool_call_id_mode": "responses"}
    if provider_key == "mistral" or any(marker in model for marker in _MISTRAL_MARKERS):
        fields |= {"sanitize_tool_call_ids": True, "tool_call_id_mode": "strict9"}
    if _is_anthropic(provider_key, api) or api in _ANTHROPIC_APIS:
        fields["preserve_native_kimi_tool_call_ids"] = False  # Anthropic ids: ^[a-zA-Z0-9_-]+$
    if fields.get("sanitize_tool_call_ids") and not fields.get("tool_call_id_mode"):
        fields["tool_call_id_mode"] = "strict"
    try:
        return TranscriptPolicy.model_validate({**fields, **(overrides or {})})
    except ValidationError as error:
        problems = [(".".join(map(str, e["loc"])), e["msg"]) for e in error.errors()]
        raise ConfigError(problems) from error


def _is_anthropic(provider: str, api: str) -> bool:
    return provider in _ANTHROPIC_PROVIDERS or (not provider and api in _ANTHROPIC_APIS)


def _is_google(provider: str, api: str) -> bool:
    return provider in _GOOGLE_PROVIDERS or (not provider and api in _GOOGLE_APIS)


def _is_openai(provider: str, api: str) -> bool:
    return provider in _OPENAI_PROVIDERS or (not provider and api in _OPENAI_APIS)


def _anthropic() -> dict[str, Any]:
    return {
        "sanitize_mode": "full",
        "sanitize_tool_call_ids": True,
        "preserve_native_anthropic_tool_use_ids": True,
        "validate_anthropic_turns": True,
    }


def _google() -> dict[str, Any]:
    return {
        "sanitize_mode": "full",
        "sanitize_tool_call_ids": True,
        "sanitize_thought_signatures": True,
        "validate_gemini_turns": True,
        "apply_google_turn_ordering": True,
    }


def _openai(api: str) -> dict[str, Any]:
    return {"sanitize_tool_call_ids": api == "openai-completions"}


def _fallback(provider: str, api: str, model: str) -> dict[str, Any]:
    if provider in _PASSTHROUGH_PROVIDERS:
        return {"sanitize_thought_signatures": "gemini" in model}
    fields: dict[str, Any] = {}
    if api in _ANTHROPIC_APIS | _GOOGLE_APIS:
        fields["sanitize_mode"] = "full"
    if api in _ANTHROPIC_APIS | _GOOGLE_APIS | {"openai-completions"}:
        fields["sanitize_tool_call_ids"] = True
    if api == "openai-completions":
        fields |= {"apply_google_turn_ordering": True, "validate_gemini_turns": True}
        fields["validate_anthropic_turns"] = True
    if api in RESPONSES_APIS and "claude" in model:
        fields["validate_anthropic_turns"] = True
    if provider in _MINIMAX_PROVIDERS or "minimax" in model:
        fields["sanitize_tool_call_ids"] = True
    return fields
