"""Per-provider policy and the full pipeline."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.transcript.factories import asst, res, syn, user
from workers.core.transcript import TranscriptPolicy, repair_transcript, resolve_policy
from workers.errors import ConfigError


@pytest.mark.parametrize(
    ("provider", "api", "model", "expected"),
    [
        ("anthropic", None, None, {"sanitize_mode": "full", "tool_call_id_mode": "strict"}),
        ("anthropic", None, None, {"preserve_native_kimi_tool_call_ids": False}),
        (None, "anthropic-messages", None, {"preserve_native_kimi_tool_call_ids": False}),
        (None, "openai-completions", None, {"preserve_native_kimi_tool_call_ids": True}),
        (
            "anthropic",
            None,
            None,
            {"preserve_native_anthropic_tool_use_ids": True, "validate_anthropic_turns": True},
        ),
        ("amazon-bedrock", None, None, {"validate_anthropic_turns": True}),
        ("google", None, None, {"tool_call_id_mode": "strict", "validate_gemini_turns": True}),
        ("mistral", None, None, {"tool_call_id_mode": "strict9"}),
        ("openrouter", "openai-completions", "mistralai/codestral", {"tool_call_id_mode": "strict9"}),
        ("openrouter", "openai-completions", "google/gemini-2.5", {"sanitize_thought_signatures": True}),
        (
            "openai",
            "openai-responses",
            None,
            {"tool_call_id_mode": "responses", "missing_tool_result_text": "aborted"},
        ),
        ("openai", "openai-completions", None, {"tool_call_id_mode": "strict"}),
        (None, "openai-completions", None, {"sanitize_tool_call_ids": True}),
        ("moonshot", "openai-completions", None, {"validate_anthropic_turns": True}),
        ("minimax", None, None, {"tool_call_id_mode": "strict"}),
        ("someone", "openai-responses", "claude-x", {"validate_anthropic_turns": True}),
        (None, None, None, {"sanitize_tool_call_ids": False}),
    ],
)
def test_policy_matrix(
    provider: str | None, api: str | None, model: str | None, expected: dict[str, Any]
) -> None:
    policy = resolve_policy(provider, api, model)
    assert {key: getattr(policy, key) for key in expected} == expected


@pytest.mark.parametrize(
    ("provider", "api"),
    [("openai", "openai-responses"), ("openai", "openai-completions"), ("anthropic", None), ("x", None)],
)
def test_every_provider_repairs_and_synthesises(provider: str, api: str | None) -> None:
    policy = resolve_policy(provider, api)
    assert policy.repair_tool_use_result_pairing
    assert policy.allow_synthetic_tool_results
    out = repair_transcript([asst("c1"), user()], policy).messages
    assert out[1]["details"]["synthetic"] is True


def test_overrides_apply_and_are_validated() -> None:
    assert resolve_policy("openai", overrides={"errored_turns": "preserve"}).errored_turns == "preserve"
    with pytest.raises(ConfigError, match="errored_turns"):
        resolve_policy("openai", overrides={"errored_turns": "keep"})
    with pytest.raises(ConfigError):
        resolve_policy(overrides={"no_such_field": True})


def test_full_pipeline_in_order() -> None:
    # Given a bad call, a missing result, an errored turn and ids Mistral would reject
    bad = {"type": "toolCall", "id": "bad", "name": "rm -rf", "arguments": {}}
    given = [user(), asst("call_1", bad), user("b"), asst("call_2", stop="error"), res("call_2")]
    # When
    result = repair_transcript(given, resolve_policy("mistral"), strip_details=True)
    # Then
    out = result.messages
    assert [m["role"] for m in out] == ["user", "assistant", "toolResult", "user"]
    new_id = out[1]["content"][0]["id"]
    assert len(new_id) == 9
    assert out[2]["toolCallId"] == new_id
    assert "details" not in out[2]
    assert result.report.inputs is not None
    assert result.report.inputs.dropped_tool_calls == 1
    assert result.report.pairing[0].dropped_errored_turns == 1
    assert result.report.changed


def test_pipeline_uses_lookup_with_original_ids() -> None:
    ledger = {"call_1": res("call_1", "late but real")}
    given = [user(), asst("call_1")]
    result = repair_transcript(given, resolve_policy("google"), lookup=lambda i, n: ledger.get(i))
    assert result.messages[2]["content"][0]["text"] == "late but real"
    assert result.messages[2]["toolCallId"] == result.messages[1]["content"][0]["id"] == "call1"


def test_pipeline_returns_input_when_clean() -> None:
    given = [user(), asst("c1"), res("c1")]
    assert repair_transcript(given, TranscriptPolicy()).messages is given


def test_pipeline_is_idempotent() -> None:
    given = [asst("a_1", "a_1"), res("a_1"), user(), syn("zz")]
    policy = resolve_policy("mistral")
    once = repair_transcript(given, policy).messages
    assert repair_transcript(once, policy).messages is once
