"""Provider-format calls in, provider-format results out: every format, both ways."""

from __future__ import annotations

import json
from typing import Any

import pytest

from workers.core.models import SyntheticReason, ToolCall, ToolResult
from workers.core.provider_calls import (
    FORMATS,
    ParsedCall,
    ProviderTurn,
    RejectedCall,
    check_format,
    decode_calls,
    encode_results,
)
from workers.core.results import success_result, synthetic_result, tool_error_result
from workers.core.transcript import repair_pairing
from workers.core.transcript.adapters import anthropic, decode, gemini, openai_chat, openai_responses
from workers.errors import CompactionLoopPersisted, ProviderFormatError

# --- one assistant message per format, each with two calls ----------------------------------

MESSAGES: dict[str, Any] = {
    "neutral": {
        "calls": [{"id": "c1", "name": "echo", "arguments": {"text": "a"}}, {"id": "c2", "name": "noop"}]
    },
    "anthropic": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [
            {"type": "text", "text": "let me look"},
            {"type": "tool_use", "id": "c1", "name": "echo", "input": {"text": "a"}},
            {"type": "tool_use", "id": "c2", "name": "noop", "input": {}},
        ],
        "stop_reason": "tool_use",
    },
    "openai-chat": {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "echo", "arguments": '{"text": "a"}'}},
            {"id": "c2", "type": "function", "function": {"name": "noop", "arguments": "{}"}},
        ],
    },
    "openai-responses": [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "content": [{"type": "output_text", "text": "hm"}],
        },
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "echo", "arguments": '{"text":"a"}'},
        {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "noop", "arguments": "{}"},
    ],
    "gemini": {
        "role": "model",
        "parts": [
            {"text": "calling"},
            {"functionCall": {"id": "c1", "name": "echo", "args": {"text": "a"}}},
            {"functionCall": {"id": "c2", "name": "noop"}},
        ],
    },
}

EXPECTED_CALLS = [ToolCall(id="c1", name="echo", arguments={"text": "a"}), ToolCall(id="c2", name="noop")]


def _results(calls: list[ToolCall]) -> list[ToolResult]:
    ok = success_result(calls[0], "aa", elapsed_ms=3, attempt=1)
    failed = tool_error_result(calls[1], "ValueError", "broken", elapsed_ms=4, attempt=1)
    return [ok, failed]


OK_TEXT = "aa"
ERROR_TEXT = "Tool 'noop' failed with ValueError: broken"

EXPECTED_APPEND: dict[str, Any] = {
    "anthropic": {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "c1",
                "content": [{"type": "text", "text": OK_TEXT}],
                "is_error": False,
            },
            {
                "type": "tool_result",
                "tool_use_id": "c2",
                "content": [{"type": "text", "text": ERROR_TEXT}],
                "is_error": True,
            },
        ],
    },
    "openai-chat": [
        {"role": "tool", "tool_call_id": "c1", "content": OK_TEXT},
        {"role": "tool", "tool_call_id": "c2", "content": ERROR_TEXT},
    ],
    "openai-responses": [
        {"type": "function_call_output", "call_id": "c1", "output": OK_TEXT},
        {"type": "function_call_output", "call_id": "c2", "output": ERROR_TEXT},
    ],
    "gemini": {
        "role": "user",
        "parts": [
            {"functionResponse": {"id": "c1", "name": "echo", "response": {"output": OK_TEXT}}},
            {"functionResponse": {"id": "c2", "name": "noop", "response": {"error": ERROR_TEXT}}},
        ],
    },
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_reads_every_call_in_order(fmt: str) -> None:
    # When
    parsed = decode_calls(fmt, MESSAGES[fmt])
    # Then
    assert [p.call for p in parsed] == EXPECTED_CALLS
    assert [type(p.call) for p in parsed] == [ToolCall, ToolCall]
    assert all(p.send_id for p in parsed)


@pytest.mark.parametrize("fmt", sorted(EXPECTED_APPEND))
def test_encode_gives_exactly_what_the_provider_expects_next(fmt: str) -> None:
    # Given
    parsed = decode_calls(fmt, MESSAGES[fmt])
    # When
    append = encode_results(fmt, _results([p.call for p in parsed]), parsed)
    # Then
    assert append == EXPECTED_APPEND[fmt]
    json.dumps(append)  # JSON-ready


def test_neutral_append_is_the_neutral_results() -> None:
    results = _results(EXPECTED_CALLS)
    assert encode_results("neutral", results) == [r.to_neutral() for r in results]


def _transcript(fmt: str, message: Any, append: Any) -> list[Any]:
    if fmt in ("anthropic", "gemini"):
        return [message, append]
    if fmt == "openai-chat":
        return [message, *append]
    return [*message, *append]


@pytest.mark.parametrize("fmt", sorted(EXPECTED_APPEND))
def test_round_trip_the_message_and_its_append_form_a_transcript_repair_leaves_alone(fmt: str) -> None:
    # Given a message and the append built for it
    parsed = decode_calls(fmt, MESSAGES[fmt])
    append = encode_results(fmt, _results([p.call for p in parsed]), parsed)
    # When the transcript adapters read both back
    neutral = decode(fmt, _transcript(fmt, MESSAGES[fmt], append))
    pairing = repair_pairing(neutral)
    # Then every call has exactly one result, in place: nothing to add, drop or move
    assert pairing.messages is neutral
    results = [m for m in neutral if m["role"] == "toolResult"]
    assert [r["content"][0]["text"] for r in results] == [OK_TEXT, ERROR_TEXT]
    no_error_flag = fmt in ("openai-chat", "openai-responses")  # these APIs have none
    assert [r.get("isError") for r in results] == ([None, None] if no_error_flag else [False, True])


@pytest.mark.parametrize("fmt", ["anthropic", "gemini"])
def test_one_message_formats_append_nothing_without_calls(fmt: str) -> None:
    assert encode_results(fmt, []) is None


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        ("neutral", {"calls": []}),
        ("anthropic", {"role": "assistant", "content": "just text"}),
        ("anthropic", {"role": "assistant", "content": [{"type": "text", "text": "t"}]}),
        ("openai-chat", {"role": "assistant", "content": "just text"}),
        ("openai-chat", {"role": "assistant", "content": "t", "tool_calls": None}),
        ("openai-responses", [{"type": "message", "role": "assistant", "content": []}]),
        ("openai-responses", {"output": []}),
        ("gemini", {"role": "model", "parts": [{"text": "t"}]}),
    ],
)
def test_a_message_without_calls_decodes_to_none(fmt: str, message: Any) -> None:
    assert decode_calls(fmt, message) == []


def test_responses_accepts_the_whole_response_object() -> None:
    response = {"id": "resp_1", "object": "response", "output": MESSAGES["openai-responses"]}
    assert [p.call for p in decode_calls("openai-responses", response)] == EXPECTED_CALLS


# --- ids --------------------------------------------------------------------------------------

ODD_IDS = [
    "call|with|pipes",
    " padded ",
    "tab\tand\nnewline",
    "ünïcødé-😀-调用",
    'quote"back\\slash',
    "{tag}:/%2F?#&=",
    "x" * 256,
]


def _with_id(fmt: str, call_id: str) -> Any:
    messages: dict[str, Any] = {
        "anthropic": {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": call_id, "name": "echo", "input": {}}],
        },
        "openai-chat": {
            "role": "assistant",
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "echo", "arguments": "{}"}}
            ],
        },
        "openai-responses": [
            {"type": "function_call", "id": "fc_1", "call_id": call_id, "name": "echo", "arguments": "{}"}
        ],
        "gemini": {"role": "model", "parts": [{"functionCall": {"id": call_id, "name": "echo", "args": {}}}]},
        "neutral": {"calls": [{"id": call_id, "name": "echo", "arguments": {}}]},
    }
    return messages[fmt]


def _wire_id(fmt: str, append: Any) -> Any:
    if fmt == "anthropic":
        return append["content"][0]["tool_use_id"]
    if fmt == "openai-chat":
        return append[0]["tool_call_id"]
    if fmt == "openai-responses":
        return append[0]["call_id"]
    if fmt == "gemini":
        return append["parts"][0]["functionResponse"]["id"]
    return append[0]["toolCallId"]


@pytest.mark.parametrize("call_id", ODD_IDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_odd_ids_round_trip_exactly(fmt: str, call_id: str) -> None:
    # Given
    parsed = decode_calls(fmt, _with_id(fmt, call_id))
    # When
    append = encode_results(fmt, [success_result(parsed[0].call, "ok", elapsed_ms=1, attempt=1)], parsed)
    # Then
    assert parsed[0].call.id == call_id
    assert _wire_id(fmt, append) == call_id
    assert _wire_id(fmt, json.loads(json.dumps(append))) == call_id


# --- Gemini calls without ids -----------------------------------------------------------------

GEMINI_NO_IDS = {
    "role": "model",
    "parts": [
        {"text": "two lookups"},
        {"functionCall": {"name": "echo", "args": {"text": "a"}}},
        {"functionCall": {"name": "echo", "args": {"text": "b"}}, "thoughtSignature": "sig"},
        {"functionCall": {"id": "given", "name": "noop"}},
    ],
}


def test_gemini_calls_without_ids_get_the_ids_transcript_repair_gives_them() -> None:
    # Given the Content that will be contents[4]
    parsed = decode_calls("gemini", GEMINI_NO_IDS, turn=4)
    # Then ids come from the turn and the part's position, like the transcript adapter's
    assert [p.call.id for p in parsed] == ["gemini-4-1", "gemini-4-2", "given"]
    assert [p.send_id for p in parsed] == [False, False, True]
    neutral = gemini.to_neutral([{"role": "user", "parts": [{"text": "q"}]}] * 4 + [GEMINI_NO_IDS])
    assert [b["id"] for b in neutral[-1]["content"] if b["type"] == "toolCall"] == [
        "gemini-4-1",
        "gemini-4-2",
        "given",
    ]


def test_gemini_responses_leave_generated_ids_out_and_keep_given_ones() -> None:
    # Given
    parsed = decode_calls("gemini", GEMINI_NO_IDS, turn=4)
    results = [
        success_result(p.call, p.call.arguments.get("text", "-"), elapsed_ms=1, attempt=1) for p in parsed
    ]
    # When
    append = encode_results("gemini", results, parsed)
    # Then responses are in call order, by name, with an id only where Gemini sent one
    assert append == {
        "role": "user",
        "parts": [
            {"functionResponse": {"name": "echo", "response": {"output": "a"}}},
            {"functionResponse": {"name": "echo", "response": {"output": "b"}}},
            {"functionResponse": {"id": "given", "name": "noop", "response": {"output": "-"}}},
        ],
    }
    # And without the parsed calls (results from collect) the generated ids are recognised
    assert encode_results("gemini", results) == append
    # And the transcript adapter pairs each response with its call
    neutral = gemini.to_neutral([GEMINI_NO_IDS, append])
    assert repair_pairing(neutral).messages is neutral


def test_gemini_ids_without_a_turn_are_deterministic_per_content() -> None:
    # When
    first = [p.call.id for p in decode_calls("gemini", GEMINI_NO_IDS)]
    again = [p.call.id for p in decode_calls("gemini", json.loads(json.dumps(GEMINI_NO_IDS)))]
    other = [
        p.call.id for p in decode_calls("gemini", {"role": "model", "parts": GEMINI_NO_IDS["parts"][:2]})
    ]
    # Then the same Content gets the same ids, another Content other ones
    assert first == again
    assert first[0].startswith("gemini-")
    assert first[0].endswith("-1")
    assert first[2] == "given"
    assert other[0] != first[0]
    assert len(set(first)) == 3


# --- arguments that cannot be read --------------------------------------------------------------

BAD_JSON_STRINGS = [
    pytest.param("not json", "not valid JSON", id="not-json"),
    pytest.param('{"text": "a"', "not valid JSON", id="truncated"),
    pytest.param('{"text": "a"} trailing', "not valid JSON", id="trailing-garbage"),
    pytest.param("", "not valid JSON", id="empty-string"),
    pytest.param("{'text': 'a'}", "not valid JSON", id="single-quotes"),
    pytest.param('["a"]', "not an array", id="array"),
    pytest.param("42", "not a number", id="number"),
    pytest.param('"text"', "not a string", id="string"),
    pytest.param("null", "not null", id="null"),
    pytest.param("true", "not a boolean", id="boolean"),
    pytest.param("NaN", "NaN", id="nan"),
    pytest.param('{"n": Infinity}', "Infinity", id="infinity"),
    pytest.param('{"text": "a", "text": "b"}', "repeat the key 'text'", id="repeated-key"),
    pytest.param('{"text": "\\ud800"}', "unpaired surrogate", id="lone-surrogate"),
]

BAD_OBJECTS = [
    pytest.param(["a"], "not an array", id="array"),
    pytest.param(7, "not a number", id="number"),
    pytest.param(True, "not a boolean", id="boolean"),
    pytest.param("{broken", "not valid JSON", id="unparseable-string"),
    pytest.param('"a string"', "not a string", id="json-string"),
    pytest.param({"text": "\ud800"}, "unpaired surrogate", id="lone-surrogate"),
    pytest.param({"n": float("nan")}, "not JSON values", id="nan"),
    pytest.param({"s": {1, 2}}, "not JSON values", id="set"),
]


def _with_arguments(fmt: str, arguments: Any) -> Any:
    if fmt == "anthropic":
        return {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "c1", "name": "echo", "input": arguments}],
        }
    if fmt == "openai-chat":
        call = {"id": "c1", "type": "function", "function": {"name": "echo", "arguments": arguments}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if fmt == "openai-responses":
        return [
            {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "echo", "arguments": arguments}
        ]
    if fmt == "gemini":
        return {"role": "model", "parts": [{"functionCall": {"id": "c1", "name": "echo", "args": arguments}}]}
    return {"calls": [{"id": "c1", "name": "echo", "arguments": arguments}]}


def _assert_rejected(parsed: list[ParsedCall], problem: str) -> None:
    assert len(parsed) == 1
    call = parsed[0].call
    assert isinstance(call, RejectedCall)
    assert (call.id, call.name, call.arguments) == ("c1", "echo", {})
    assert problem in call.problems[0]


@pytest.mark.parametrize(("raw", "problem"), BAD_JSON_STRINGS)
@pytest.mark.parametrize("fmt", ["openai-chat", "openai-responses", "neutral"])
def test_unreadable_argument_strings_become_invalid_arguments_never_an_exception(
    fmt: str, raw: str, problem: str
) -> None:
    _assert_rejected(decode_calls(fmt, _with_arguments(fmt, raw)), problem)


@pytest.mark.parametrize(("value", "problem"), BAD_OBJECTS)
@pytest.mark.parametrize("fmt", ["anthropic", "gemini", "neutral"])
def test_arguments_that_are_not_an_object_become_invalid_arguments(
    fmt: str, value: Any, problem: str
) -> None:
    _assert_rejected(decode_calls(fmt, _with_arguments(fmt, value)), problem)


@pytest.mark.parametrize("fmt", ["anthropic", "gemini", "neutral"])
def test_missing_or_null_arguments_mean_no_arguments(fmt: str) -> None:
    parsed = decode_calls(fmt, _with_arguments(fmt, None))
    assert [p.call for p in parsed] == [ToolCall(id="c1", name="echo", arguments={})]


def test_arguments_string_encoding_is_not_required_to_be_canonical() -> None:
    # The transcript adapter keeps such strings as they are; the call still gets an object
    parsed = decode_calls("openai-chat", _with_arguments("openai-chat", ' { "text" : "a" , "n": 1.0 } '))
    assert parsed[0].call.arguments == {"text": "a", "n": 1.0}


def test_a_rejected_call_does_not_stop_the_others() -> None:
    message = _with_arguments("openai-chat", "{oops")
    message["tool_calls"].append(
        {"id": "c2", "type": "function", "function": {"name": "echo", "arguments": '{"text": "b"}'}}
    )
    parsed = decode_calls("openai-chat", message)
    assert [type(p.call) for p in parsed] == [RejectedCall, ToolCall]
    assert parsed[1].call.arguments == {"text": "b"}


# --- messages that are not in the format's shape ------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "message", "path"),
    [
        ("anthropic", "hello", "$"),
        ("anthropic", [MESSAGES["anthropic"]], "$"),
        ("anthropic", {"role": "user", "content": []}, "$.role"),
        ("anthropic", {"role": "assistant", "content": 5}, "$.content"),
        ("anthropic", {"role": "assistant", "content": ["text"]}, "$.content[0]"),
        (
            "anthropic",
            {"role": "assistant", "content": [{"type": "tool_use", "id": 3, "name": "f"}]},
            "$.content[0].id",
        ),
        (
            "anthropic",
            {"role": "assistant", "content": [{"type": "tool_use", "id": "c"}]},
            "$.content[0].name",
        ),
        ("openai-chat", None, "$"),
        ("openai-chat", {"role": "tool", "content": "x"}, "$.role"),
        ("openai-chat", {"role": "assistant", "tool_calls": "x"}, "$.tool_calls"),
        ("openai-chat", {"role": "assistant", "tool_calls": [{"id": "c"}]}, "$.tool_calls[0].function"),
        (
            "openai-chat",
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {}}}]},
            "$.tool_calls[0].function.arguments",
        ),
        (
            "openai-chat",
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
            "$.tool_calls[0].id",
        ),
        ("openai-responses", {"role": "assistant"}, "$"),
        ("openai-responses", [3], "$[0]"),
        (
            "openai-responses",
            {"output": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "$.output[0].call_id",
        ),
        ("openai-responses", [{"type": "function_call", "call_id": "c", "arguments": "{}"}], "$[0].name"),
        ("openai-responses", [{"type": "function_call", "call_id": "c", "name": "f"}], "$[0].arguments"),
        ("gemini", [], "$"),
        ("gemini", {"role": "user", "parts": []}, "$.role"),
        ("gemini", {"role": "model"}, "$.parts"),
        (
            "gemini",
            {"role": "model", "parts": [{"functionCall": {"args": {}}}]},
            "$.parts[0].functionCall.name",
        ),
        (
            "gemini",
            {"role": "model", "parts": [{"functionCall": {"name": "f", "id": 7}}]},
            "$.parts[0].functionCall.id",
        ),
        ("neutral", [], "$"),
        ("neutral", {"calls": {}}, "$.calls"),
        ("neutral", {"calls": [{"name": "f"}]}, "$.calls[0].id"),
        ("neutral", {"calls": [{"id": "c", "name": None}]}, "$.calls[0].name"),
        ("neutral", {"calls": [{"id": "", "name": "f"}]}, "$.calls[0].id"),
        ("neutral", {"calls": [{"id": "x" * 257, "name": "f"}]}, "$.calls[0].id"),
        ("neutral", {"calls": [{"id": "c", "name": "\ud800"}]}, "$.calls[0].name"),
        ("neutral", {"calls": [{"id": "c", "name": "f"}, {"id": "c", "name": "g"}]}, "$.calls[1].id"),
    ],
)
def test_a_malformed_message_raises_with_the_json_path(fmt: str, message: Any, path: str) -> None:
    with pytest.raises(ProviderFormatError) as caught:
        decode_calls(fmt, message)
    assert caught.value.path == path
    assert str(caught.value).startswith(f"{path}: ")


def test_a_repeated_id_names_both_places() -> None:
    message = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "c", "name": "f", "input": {}}] * 2,
    }
    with pytest.raises(
        ProviderFormatError, match=r"\$\.content\[1\]\.id: call id 'c' repeats \$\.content\[0\]\.id"
    ):
        decode_calls("anthropic", message)


@pytest.mark.parametrize(
    "use", [check_format, lambda f: decode_calls(f, {}), lambda f: encode_results(f, [])]
)
def test_an_unknown_format_lists_the_valid_ones(use: Any) -> None:
    with pytest.raises(ProviderFormatError) as caught:
        use("openai")
    assert caught.value.path is None
    assert caught.value.formats == FORMATS
    assert str(caught.value) == (
        "unknown format 'openai'; valid formats: neutral, anthropic, openai-chat, openai-responses, gemini"
    )


# --- one encoder per provider ------------------------------------------------------------------


def test_tool_result_methods_and_the_transcript_encoders_give_the_same_shapes() -> None:
    # Given a result, and the same result as a neutral transcript message
    result = synthetic_result(
        ToolCall(id="c1", name="exec"), SyntheticReason.CRASHED, elapsed_ms=5, attempt=1
    )
    neutral = [result.to_neutral()]
    # Then each ToolResult.to_* is what the transcript encoder writes for that result
    assert anthropic.from_neutral(neutral) == [{"role": "user", "content": [result.to_anthropic()]}]
    assert openai_chat.from_neutral(neutral) == [result.to_openai()]
    assert openai_responses.from_neutral(neutral) == [result.to_openai_responses()]
    assert gemini.from_neutral(neutral) == [{"role": "user", "parts": [result.to_gemini()]}]
    assert result.to_gemini(send_id=False) == {
        "functionResponse": {"name": "exec", "response": {"error": result.text}}
    }


# --- the answer -------------------------------------------------------------------------------


def test_a_turns_answer_carries_results_append_and_the_loop_abort() -> None:
    # Given
    turn = ProviderTurn.decode("openai-chat", MESSAGES["openai-chat"])
    results = _results(turn.calls)
    abort = CompactionLoopPersisted("compaction_loop_persisted", 3, "the same call repeated after compaction")
    abort.results = list(results)
    # When
    plain = turn.answer(results)
    aborted = turn.answer(abort)
    # Then
    assert plain.aborted is None
    assert plain.results == results
    assert plain.append == EXPECTED_APPEND["openai-chat"]
    assert aborted.aborted == {
        "reason": "the same call repeated after compaction",
        "detector": "compaction_loop_persisted",
        "count": 3,
    }
    assert json.loads(json.dumps(aborted.to_json()))["aborted"]["count"] == 3
    assert aborted.to_json()["results"] == [r.to_neutral() for r in results]
