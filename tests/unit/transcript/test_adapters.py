"""Provider adapters: exact neutral forms and round trips both ways."""

from __future__ import annotations

from typing import Any

import pytest

from workers.core.transcript import repair_pairing
from workers.core.transcript.adapters import decode, encode
from workers.errors import TranscriptRepairError

ARGS = {"path": "a.txt"}

NEUTRAL: list[dict[str, Any]] = [
    {"role": "user", "content": "read it"},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "sure"},
            {"type": "toolCall", "id": "call_1", "name": "read", "arguments": ARGS},
            {"type": "toolCall", "id": "call_2", "name": "ls", "arguments": {}},
        ],
    },
    {
        "role": "toolResult",
        "toolCallId": "call_1",
        "toolName": "read",
        "content": [{"type": "text", "text": "hi"}],
        "isError": False,
    },
    {
        "role": "toolResult",
        "toolCallId": "call_2",
        "toolName": "ls",
        "content": [{"type": "text", "text": "a"}],
        "isError": True,
    },
    {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
]

ANTHROPIC: list[dict[str, Any]] = [
    {"role": "user", "content": "read it"},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "sure"},
            {"type": "tool_use", "id": "call_1", "name": "read", "input": ARGS},
            {"type": "tool_use", "id": "call_2", "name": "ls", "input": {}},
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "call_1",
                "content": [{"type": "text", "text": "hi"}],
                "is_error": False,
            },
            {
                "type": "tool_result",
                "tool_use_id": "call_2",
                "content": [{"type": "text", "text": "a"}],
                "is_error": True,
            },
            {"type": "text", "text": "thanks"},
        ],
    },
]

CHAT = [
    {"role": "user", "content": "read it"},
    {
        "role": "assistant",
        "content": "sure",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read", "arguments": '{"path":"a.txt"}'},
            },
            {"id": "call_2", "type": "function", "function": {"name": "ls", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "hi"},
    {"role": "tool", "tool_call_id": "call_2", "content": "a"},
    {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
]

RESPONSES = [
    {"role": "user", "content": "read it"},
    {"role": "assistant", "content": [{"type": "output_text", "text": "sure"}]},
    {"type": "function_call", "call_id": "call_1", "name": "read", "arguments": '{"path":"a.txt"}'},
    {"type": "function_call", "call_id": "call_2", "name": "ls", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "hi"},
    {"type": "function_call_output", "call_id": "call_2", "output": "a"},
    {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
]

GEMINI = [
    {"role": "user", "parts": [{"text": "read it"}]},
    {
        "role": "model",
        "parts": [
            {"text": "sure"},
            {"functionCall": {"name": "read", "args": ARGS, "id": "call_1"}},
            {"functionCall": {"name": "ls", "args": {}, "id": "call_2"}},
        ],
    },
    {
        "role": "user",
        "parts": [
            {"functionResponse": {"name": "read", "response": {"output": "hi"}, "id": "call_1"}},
            {"functionResponse": {"name": "ls", "response": {"error": "a"}, "id": "call_2"}},
            {"text": "thanks"},
        ],
    },
]


def _without_is_error(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if k != "isError"} for m in messages]


def _with_list_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    first = {"role": "user", "content": [{"type": "text", "text": "read it"}]}
    return [first, *messages[1:]]


# Each provider expresses a slightly different part of the neutral form: Chat and Responses
# results carry no error flag, and Gemini user text is always a list of parts.
EXPECTED_NEUTRAL = {
    "anthropic": NEUTRAL,
    "openai-chat": _without_is_error(NEUTRAL),
    "openai-responses": _without_is_error(NEUTRAL),
    "gemini": _with_list_user(NEUTRAL),
}
WIRE = {"anthropic": ANTHROPIC, "openai-chat": CHAT, "openai-responses": RESPONSES, "gemini": GEMINI}


@pytest.mark.parametrize("fmt", WIRE)
def test_provider_to_neutral(fmt: str) -> None:
    assert decode(fmt, WIRE[fmt]) == EXPECTED_NEUTRAL[fmt]


@pytest.mark.parametrize("fmt", WIRE)
def test_neutral_to_provider_to_neutral(fmt: str) -> None:
    neutral = EXPECTED_NEUTRAL[fmt]
    assert decode(fmt, encode(fmt, neutral, [])) == neutral


@pytest.mark.parametrize("fmt", WIRE)
def test_provider_to_neutral_to_provider(fmt: str) -> None:
    assert encode(fmt, decode(fmt, WIRE[fmt]), WIRE[fmt]) == WIRE[fmt]


@pytest.mark.parametrize("fmt", WIRE)
def test_valid_provider_transcript_needs_no_repair(fmt: str) -> None:
    neutral = decode(fmt, WIRE[fmt])
    assert repair_pairing(neutral).messages is neutral


@pytest.mark.parametrize(
    ("fmt", "key"), [("anthropic", "messages"), ("gemini", "contents"), ("openai-responses", "input")]
)
def test_envelope_kept(fmt: str, key: str) -> None:
    document = {"model": "m", key: WIRE[fmt]}
    assert encode(fmt, decode(fmt, document), document) == document


ODD_BUT_VALID = {
    "anthropic": [
        {
            "role": "user",
            "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": "sig"},
                {"type": "redacted_thinking", "data": "x"},
            ],
        },
        {"role": "user", "content": [{"type": "text", "text": "q", "cache_control": {"type": "ephemeral"}}]},
    ],
    "openai-chat": [
        {"role": "system", "content": "be brief"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "x", "name": "f"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "refusal": None,
        },
    ],
    "openai-responses": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "a", "annotations": []}],
        },
        {
            "type": "function_call",
            "call_id": "call_9",
            "id": "fc_9",
            "name": "f",
            "arguments": "{}",
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "call_9", "output": "done"},
    ],
    "gemini": [
        {"role": "user", "parts": [{"text": "q"}, {"inlineData": {"mimeType": "image/png", "data": "AA=="}}]},
        {
            "role": "model",
            "parts": [
                {"text": "plan", "thought": True, "thoughtSignature": "s"},
                {"functionCall": {"name": "f", "args": {}}, "thoughtSignature": "t"},
            ],
        },
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"result": {"n": 1}}}}]},
    ],
}


@pytest.mark.parametrize("fmt", ODD_BUT_VALID)
def test_odd_but_valid_input_round_trips(fmt: str) -> None:
    document = ODD_BUT_VALID[fmt]
    neutral = decode(fmt, document)
    assert encode(fmt, neutral, document) == document
    assert decode(fmt, encode(fmt, neutral, document)) == neutral
    assert repair_pairing(neutral).messages is neutral


def test_responses_call_id_pairs_output_and_item_id_rides_along() -> None:
    neutral = decode("openai-responses", ODD_BUT_VALID["openai-responses"])
    assert neutral[-1]["toolCallId"] == "call_9"
    assert neutral[-2]["content"][-1]["id"] == "call_9"
    assert neutral[-2]["content"][-1]["responsesItemId"] == "fc_9"


def test_gemini_id_less_response_pairs_by_name() -> None:
    neutral = decode("gemini", ODD_BUT_VALID["gemini"])
    assert neutral[-1]["toolCallId"] == neutral[-2]["content"][-1]["id"]


def test_repair_through_anthropic_fills_missing_tool_result() -> None:
    # Given an Anthropic transcript whose second call never got a result
    document = [ANTHROPIC[0], ANTHROPIC[1], {"role": "user", "content": [ANTHROPIC[2]["content"][0]]}]
    # When
    repaired = encode("anthropic", repair_pairing(decode("anthropic", document)).messages, document)
    # Then the next user message answers both calls, in call order
    answered = [block["tool_use_id"] for block in repaired[2]["content"]]
    assert answered == ["call_1", "call_2"]
    assert repaired[2]["content"][1]["is_error"] is True


@pytest.mark.parametrize(
    ("fmt", "document", "path"),
    [
        (
            "anthropic",
            [{"role": "assistant", "content": [{"type": "tool_use", "id": 3, "name": "f", "input": {}}]}],
            "$[0].content[0].id",
        ),
        ("anthropic", {"messages": [{"role": "bot", "content": "x"}]}, "$.messages[0].role"),
        ("anthropic", {"nope": []}, "$"),
        (
            "openai-chat",
            [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}],
            "$[0].tool_calls[0].function.arguments",
        ),
        ("openai-chat", [{"role": "tool", "content": "x"}], "$[0].tool_call_id"),
        ("openai-responses", [{"type": "function_call", "name": "f", "arguments": "{}"}], "$[0].call_id"),
        (
            "gemini",
            [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}],
            "$[0].parts[0].functionCall.name",
        ),
        ("gemini", [{"role": "user"}], "$[0].parts"),
        (
            "neutral",
            [{"role": "assistant", "content": [{"type": "toolCall", "id": 1}]}],
            "$[0].content[0].id",
        ),
        ("neutral", [{"role": "toolResult", "isError": "yes"}], "$[0].isError"),
        ("neutral", {"role": "user"}, "$"),
        ("neutral", [3], "$[0]"),
    ],
)
def test_malformed_input_names_the_path(fmt: str, document: Any, path: str) -> None:
    with pytest.raises(TranscriptRepairError) as raised:
        decode(fmt, document)
    assert raised.value.path == path


def test_gemini_synthetic_result_for_id_less_call_sends_no_id() -> None:
    # Given a Gemini call without an id that never got a response
    document = [{"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]}]
    # When
    repaired = encode("gemini", repair_pairing(decode("gemini", document)).messages, document)
    # Then the inserted response pairs by name, as Gemini does, and invents no id
    assert repaired[1]["parts"][0]["functionResponse"].keys() == {"name", "response"}
