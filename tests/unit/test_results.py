"""Synthetic results: one row per reason, provider shapes."""

from __future__ import annotations

import pytest

from workers.core import SyntheticReason, ToolCall, ToolResult, synthetic_result, tool_error_result

CALL = ToolCall(id="c1", name="exec", arguments={"command": "ls"})


@pytest.mark.parametrize("reason", [r for r in SyntheticReason if r is not SyntheticReason.TOOL_ERROR])
def test_synthetic_result_is_marked_and_explains(reason: SyntheticReason) -> None:
    # Given / When
    result = synthetic_result(CALL, reason, elapsed_ms=1234, attempt=1, limit_s=5, detail=" (x)")
    # Then
    assert result.is_error
    assert result.details == {"synthetic": True, "reason": reason.value, "elapsed_ms": 1234, "attempt": 1}
    assert result.tool_call_id == "c1"
    assert result.text.strip()
    assert "{" not in result.text


def test_neutral_form_round_trips_through_json() -> None:
    result = synthetic_result(CALL, SyntheticReason.WORKER_LOST, elapsed_ms=5, attempt=1)
    neutral = result.to_neutral()
    assert neutral["role"] == "toolResult"
    assert neutral["toolCallId"] == "c1"
    assert neutral["isError"] is True
    assert ToolResult.from_json(result.to_json()) == result


def test_tool_error_has_type_and_message_but_no_traceback() -> None:
    result = tool_error_result(CALL, "ValueError", "bad value", elapsed_ms=3, attempt=2)
    assert "ValueError" in result.text
    assert "bad value" in result.text
    assert "Traceback" not in result.text
    assert result.details["synthetic"] is False


def test_provider_shapes() -> None:
    result = synthetic_result(CALL, SyntheticReason.CRASHED, elapsed_ms=5, attempt=1)
    anthropic = result.to_anthropic()
    assert anthropic["type"] == "tool_result"
    assert anthropic["tool_use_id"] == "c1"
    assert anthropic["is_error"] is True
    openai = result.to_openai()
    assert openai == {"role": "tool", "tool_call_id": "c1", "content": result.text}
    gemini = result.to_gemini()
    assert gemini["functionResponse"]["name"] == "exec"
    assert gemini["functionResponse"]["response"] == {"error": result.text}
