"""Table tests for the failure classes: what each provider's API rejects, repaired."""

from __future__ import annotations

import itertools
import re
from typing import Any, Final

import pytest

from tests.unit.transcript.factories import asst, call, res, text_asst, user
from tests.unit.transcript.wire_scenarios import OPENCLAW_TEXT
from workers.core.transcript import (
    DEFAULT_MISSING_TEXT,
    TranscriptPolicy,
    is_synthetic,
    repair_pairing,
    repair_transcript,
    resolve_policy,
    sanitize_tool_call_id,
)
from workers.core.transcript.adapters import decode, default_model_api, encode, idless_results
from workers.errors import ConfigError

ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]+$")


def repair_wire(fmt: str, wire: list[Any], **overrides: Any) -> Any:
    policy = resolve_policy(None, default_model_api(fmt), overrides=overrides or None)
    return encode(
        fmt, repair_transcript(decode(fmt, wire), policy, idless=idless_results(fmt)).messages, wire
    )


# -- 1. Anthropic ids: the provider's rule decides, not the id's origin -------------------------


@pytest.mark.parametrize(
    ("raw", "keep_kimi", "expected"),
    [
        ("functions.write_file:0", True, "functions.write_file:0"),
        ("functions write_file:0", True, "functions.write_file:0"),
        ("functions.write_file:0", False, "functionswritefile0"),
        ("functions write_file:0", False, "functionswritefile0"),
    ],
)
def test_strict_keeps_kimi_ids_only_where_the_provider_takes_them(
    raw: str, keep_kimi: bool, expected: str
) -> None:
    assert sanitize_tool_call_id(raw, "strict", keep_kimi_ids=keep_kimi) == expected


@pytest.mark.parametrize(
    "raw", ["functions.write_file:0", "functions write_file:0", "call|1", " call 2", "a.b/3", "x" * 80]
)
def test_anthropic_policy_gives_ids_anthropic_accepts(raw: str) -> None:
    wire = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": raw, "name": "read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": raw, "content": "ok"}]},
    ]
    out = repair_wire("anthropic", wire)
    new_id = out[1]["content"][0]["id"]
    assert ANTHROPIC_ID.match(new_id)
    assert out[2]["content"][0]["tool_use_id"] == new_id
    assert out[2]["content"][0]["content"] == "ok"


def test_native_anthropic_ids_are_kept() -> None:
    wire = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01A", "name": "r", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01A", "content": "ok"}]},
    ]
    assert repair_wire("anthropic", wire) == wire


def test_chat_completions_policy_keeps_native_kimi_ids() -> None:
    given = [user(), asst("functions.read:0"), res("functions.read:0")]
    assert repair_transcript(given, resolve_policy("moonshot", "openai-completions")).messages is given


# -- 2. Responses ids round-trip exactly, whatever they hold -----------------------------------


def _responses_call(call_id: str, item_id: str | None = None) -> dict[str, Any]:
    item = {"type": "function_call", "call_id": call_id, "name": "f", "arguments": "{}"}
    return item | ({"id": item_id} if item_id else {})


def _output(call_id: str, text: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


@pytest.mark.parametrize("call_id", ["call|a", "a|b|c", "|", "call_1|fc_9", "x y", "ü|"])
def test_responses_ids_round_trip_exactly(call_id: str) -> None:
    wire = [{"role": "user", "content": "q"}, _responses_call(call_id, "fc_1"), _output(call_id, "done")]
    neutral = decode("openai-responses", wire)
    assert neutral[1]["content"][0]["id"] == neutral[2]["toolCallId"] == call_id
    assert encode("openai-responses", neutral, wire) == wire
    assert repair_wire("openai-responses", wire) == wire


def test_responses_calls_sharing_a_prefix_before_a_bar_stay_apart() -> None:
    wire = [
        {"role": "user", "content": "q"},
        _responses_call("a|b", "fc_1"),
        _responses_call("a|c", "fc_2"),
        _output("a|c", "for c"),
        _output("a|b", "for b"),
    ]
    out = repair_wire("openai-responses", wire)
    assert [(i["call_id"], i.get("output")) for i in out[3:]] == [("a|b", "for b"), ("a|c", "for c")]


# -- 3. Repeated call_ids, repeated item ids and long call_ids in Responses ---------------------


def test_repeated_responses_call_ids_become_unique_and_keep_their_outputs() -> None:
    wire = [
        {"role": "user", "content": "q"},
        _responses_call("c1", "fc_1"),
        _output("c1", "first"),
        {"role": "user", "content": "again"},
        _responses_call("c1", "fc_1"),
        _output("c1", "second"),
    ]
    policy = resolve_policy(None, "openai-responses")
    repaired = repair_transcript(decode("openai-responses", wire), policy)
    out = encode("openai-responses", repaired.messages, wire)
    first, second = out[1]["call_id"], out[4]["call_id"]
    assert first == "c1"
    assert second != first
    assert (out[2]["call_id"], out[2]["output"]) == (first, "first")
    assert (out[5]["call_id"], out[5]["output"]) == (second, "second")
    assert "id" not in out[4]  # the repeated item id is dropped: it is optional
    assert repaired.report.ids is not None
    assert repaired.report.ids.dropped_item_ids == 1
    assert repaired.report.ids.rewritten_call_ids == 1
    assert repair_wire("openai-responses", out) == out


def test_long_responses_call_id_is_cut_to_64_and_stays_paired() -> None:
    long_id = "call_" + "x" * 100
    wire = [{"role": "user", "content": "q"}, _responses_call(long_id), _output(long_id, "done")]
    out = repair_wire("openai-responses", wire)
    assert len(out[1]["call_id"]) <= 64
    assert (out[2]["call_id"], out[2]["output"]) == (out[1]["call_id"], "done")


def test_item_id_without_fc_prefix_is_dropped() -> None:
    wire = [{"role": "user", "content": "q"}, _responses_call("c1", "item_1"), _output("c1", "done")]
    assert "id" not in repair_wire("openai-responses", wire)[1]


# -- 4. Gemini without ids: by name, per turn, in order; ambiguity reaches pairing --------------


def _fcall(name: str, call_id: str | None = None) -> dict[str, Any]:
    return {"functionCall": {"name": name, "args": {}} | ({"id": call_id} if call_id else {})}


def _fresp(name: str, text: str, call_id: str | None = None) -> dict[str, Any]:
    body = {"name": name, "response": {"output": text}}
    return {"functionResponse": body | ({"id": call_id} if call_id else {})}


def _answers(contents: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [
        (p["functionResponse"]["name"], p["functionResponse"]["response"].get("output", "synthetic"))
        for c in contents
        for p in c["parts"]
        if "functionResponse" in p
    ]


def _kinds(contents: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Every response as (name, output or error, text); a synthetic one's text reads "synthetic"."""
    kinds = []
    for content in contents:
        for part in content["parts"]:
            if "functionResponse" in part:
                response = part["functionResponse"]
                key, text = next(iter(response["response"].items()))
                text = "synthetic" if text in (DEFAULT_MISSING_TEXT, OPENCLAW_TEXT) else text
                kinds.append((response["name"], key, text))
    return kinds


def _ferror(name: str, text: str) -> dict[str, Any]:
    return {"functionResponse": {"name": name, "response": {"error": text}}}


_GO: Final = {"role": "user", "parts": [{"text": "go"}]}
_HM: Final = {"role": "user", "parts": [{"text": "hm"}]}


def _model(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "model", "parts": list(parts)}


def _user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "parts": list(parts)}


GEMINI_BY_POSITION: list[tuple[str, list[Any], list[tuple[str, str, str]]]] = [
    (
        "two calls of one name answered twice in the next turn: in order",
        [_GO, _model(_fcall("exec"), _fcall("exec")), _user(_fresp("exec", "one"), _fresp("exec", "two"))],
        [("exec", "output", "one"), ("exec", "output", "two")],
    ),
    (
        "two calls of one name, three answers: the first two in order, the extra dropped",
        [
            _GO,
            _model(_fcall("read"), _fcall("read")),
            _user(_fresp("read", "one"), _fresp("read", "two"), _fresp("read", "three")),
        ],
        [("read", "output", "one"), ("read", "output", "two")],
    ),
    (
        "two calls of one name, one answer: the first call's, by position",
        [_GO, _model(_fcall("exec"), _fcall("exec")), _user(_fresp("exec", "one"))],
        [("exec", "output", "one"), ("exec", "error", "synthetic")],
    ),
    (
        "an extra real answer takes the place of a placeholder of its turn",
        [
            _GO,
            _model(_fcall("read"), _fcall("read")),
            _user(_ferror("read", OPENCLAW_TEXT), _fresp("read", "two"), _fresp("read", "late one")),
        ],
        [("read", "output", "late one"), ("read", "output", "two")],
    ),
    (
        "names that do not line up are matched by name, in order",
        [
            _GO,
            _model(_fcall("read"), _fcall("exec"), _fcall("read")),
            _user(_fresp("exec", "e"), _fresp("read", "r1"), _fresp("ghost", "orphan"), _fresp("read", "r2")),
        ],
        [("read", "output", "r1"), ("exec", "output", "e"), ("read", "output", "r2")],
    ),
    (
        "the only call of its name, answered after a user turn: moved back",
        [
            _GO,
            _model(_fcall("read"), _fcall("exec")),
            _user(_fresp("read", "r")),
            _HM,
            _user(_fresp("exec", "e")),
        ],
        [("read", "output", "r"), ("exec", "output", "e")],
    ),
    (
        "a displaced success behind an orphan of another name stays a success",
        [_GO, _model(_fcall("read")), _HM, _user(_fresp("ghost", "orphan"), _fresp("read", "R"))],
        [("read", "output", "R")],
    ),
    (
        "a displaced error stays an error",
        [_GO, _model(_fcall("read")), _HM, _user(_ferror("read", "no such file"))],
        [("read", "error", "no such file")],
    ),
    (
        "a displaced response is not adopted while an earlier call of its name holds a placeholder",
        [
            _GO,
            _model(_fcall("read")),
            _user(_ferror("read", OPENCLAW_TEXT)),
            _HM,
            _model(_fcall("read")),
            _HM,
            _user(_fresp("ghost", "orphan"), _fresp("read", "whose?")),
        ],
        [("read", "error", "synthetic"), ("read", "error", "synthetic")],
    ),
]


@pytest.mark.parametrize(
    ("wire", "expected"), [c[1:] for c in GEMINI_BY_POSITION], ids=[c[0] for c in GEMINI_BY_POSITION]
)
def test_gemini_id_less_responses_answer_by_position(
    wire: list[Any], expected: list[tuple[str, str, str]]
) -> None:
    # When an id-less Gemini transcript is repaired
    out = repair_wire("gemini", wire)
    # Then each call holds the response its position in the turn after it names, of the same kind
    assert _kinds(out) == expected


def test_gemini_extra_response_is_reported_as_a_dropped_duplicate() -> None:
    # Given two calls of one name answered three times in the next turn
    wire = GEMINI_BY_POSITION[1][1]
    # When
    policy = resolve_policy(None, "google-generative-ai")
    report = repair_transcript(decode("gemini", wire), policy, idless="by_name").report
    # Then the third answer is the one dropped, as a duplicate
    assert [p.dropped_duplicate_count for p in report.pairing] == [1]
    assert [m["content"][0]["text"] for p in report.pairing for m in p.discarded] == ["three"]


def test_gemini_late_response_with_two_unanswered_calls_of_its_name_is_not_guessed() -> None:
    wire = [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [_fcall("exec")]},
        {"role": "user", "parts": [{"text": "and?"}]},
        {"role": "model", "parts": [_fcall("exec")]},
        {"role": "user", "parts": [{"text": "well"}]},
        {"role": "user", "parts": [_fresp("exec", "which one?")]},
    ]
    assert "which one?" not in str(repair_wire("gemini", wire))
    # Right after the second call turn, though, it is that call's answer (Gemini's own rule)
    wire[4:] = [{"role": "user", "parts": [_fresp("exec", "the second")]}]
    assert _answers(repair_wire("gemini", wire)) == [("exec", "synthetic"), ("exec", "the second")]


# -- 5. Gemini turn order after an orphan response turn is dropped -----------------------------


def test_dropping_an_orphan_response_turn_leaves_no_model_after_model() -> None:
    wire = [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [{"text": "thinking"}]},
        {"role": "user", "parts": [_fresp("ghost", "orphan", "nope")]},
        {"role": "model", "parts": [_fcall("read", "r1")]},
        {"role": "user", "parts": [_fresp("read", "ok", "r1")]},
    ]
    out = repair_wire("gemini", wire)
    roles = [c["role"] for c in out]
    assert all(a != b or a == "user" for a, b in itertools.pairwise(roles))
    assert out[1]["parts"] == [
        {"text": "thinking"},
        {"functionCall": {"name": "read", "args": {}, "id": "r1"}},
    ]


def test_history_starting_with_the_model_gets_a_user_turn_first() -> None:
    wire = [
        {"role": "model", "parts": [_fcall("read", "r1")]},
        {"role": "user", "parts": [_fresp("read", "ok", "r1")]},
    ]
    assert repair_wire("gemini", wire)[0]["role"] == "user"


# -- 6. Gemini calls sharing an id: names and order decide --------------------------------------


def test_gemini_shared_ids_paired_by_name() -> None:
    wire = [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [_fcall("read", "x"), _fcall("exec", "x")]},
        {"role": "user", "parts": [_fresp("exec", "E", "x"), _fresp("read", "R", "x")]},
    ]
    assert _answers(repair_wire("gemini", wire)) == [("read", "R"), ("exec", "E")]


def test_gemini_id_less_response_answers_the_id_less_call_of_a_mixed_turn() -> None:
    # Given a turn where one call of a name carries an id and the next does not, and one
    # id-less response
    wire: list[dict[str, Any]] = [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [_fcall("read", "r1"), _fcall("read")]},
        {"role": "user", "parts": [_fresp("read", "second")]},
    ]
    # When repaired
    out = repair_wire("gemini", wire)
    # Then the response answers the id-less call, and the call with the id gets the synthetic one
    # carrying its id (Gemini pairs an id'd call by id, so the other way round is out of order)
    responses = [p["functionResponse"] for p in out[2]["parts"]]
    assert [(r.get("id"), r["response"].get("output", "synthetic")) for r in responses] == [
        ("r1", "synthetic"),
        (None, "second"),
    ]
    # And an extra id-less response (a duplicate) stays with the id-less call, never the id'd one
    wire[1]["parts"].append(_fcall("read", "r3"))
    wire[2]["parts"].append(_fresp("read", "second again"))
    responses = [p["functionResponse"] for p in repair_wire("gemini", wire)[2]["parts"]]
    assert [(r.get("id"), r["response"].get("output", "synthetic")) for r in responses] == [
        ("r1", "synthetic"),
        (None, "second"),
        ("r3", "synthetic"),
    ]


def test_gemini_late_id_less_response_answers_its_earlier_id_less_call_not_the_next_id_d_one() -> None:
    # Given an id-less call left unanswered, then a turn whose one call of that name has an id,
    # and the first call's id-less response arriving only after that turn
    wire: list[dict[str, Any]] = [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [_fcall("read")]},
        {"role": "user", "parts": [{"text": "and then?"}]},
        {"role": "model", "parts": [_fcall("read", "r2")]},
        {"role": "user", "parts": [_fresp("read", "first")]},
    ]
    # When repaired
    out = repair_wire("gemini", wire)
    # Then the late response answers the id-less call, right after its turn, and the id'd call
    # gets a synthetic result with its id (an id-less answer to it is out of order for Gemini)
    first = [p["functionResponse"] for p in out[2]["parts"] if "functionResponse" in p]
    assert [(r.get("id"), r["response"].get("output")) for r in first] == [(None, "first")]
    second = [p["functionResponse"] for p in out[4]["parts"]]
    assert [(r.get("id"), r["response"].get("output", "synthetic")) for r in second] == [("r2", "synthetic")]


def test_gemini_displaced_id_less_response_goes_to_the_id_less_call_of_its_name() -> None:
    # Given a turn with an id-less and an id'd call of one name, the id-less one's response
    # displaced after a user message
    wire: list[dict[str, Any]] = [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [_fcall("exec"), _fcall("exec", "e2")]},
        {"role": "user", "parts": [{"text": "go on"}]},
        {"role": "user", "parts": [_fresp("exec", "mine")]},
    ]
    # When repaired
    out = repair_wire("gemini", wire)
    # Then it answers the id-less call (the only call of that name that expects no id back)
    responses = [p["functionResponse"] for p in out[2]["parts"] if "functionResponse" in p]
    assert [(r.get("id"), r["response"].get("output", "synthetic")) for r in responses] == [
        (None, "mine"),
        ("e2", "synthetic"),
    ]


# -- 7. Every policy field acts -------------------------------------------------------------------


def test_without_synthetic_results_unanswered_calls_are_removed_and_reported() -> None:
    policy = TranscriptPolicy(allow_synthetic_tool_results=False)
    repaired = repair_transcript([user(), asst("c1", call("c2", "ls")), res("c1")], policy)
    assert repaired.messages == [user(), asst("c1"), res("c1")]
    report = repaired.report.pairing[0]
    assert report.added == ()
    assert report.unanswered == (("c2", "ls"),)
    assert report.to_json()["droppedUnansweredCalls"] == [{"id": "c2", "name": "ls"}]


def test_without_synthetic_results_a_turn_of_unanswered_calls_goes() -> None:
    policy = TranscriptPolicy(allow_synthetic_tool_results=False)
    assert repair_transcript([user(), asst("c1")], policy).messages == [user()]


BLANK = {"role": "assistant", "content": [{"type": "text", "text": " "}]}
THINKING = {"type": "thinking", "thinking": "hm", "thinkingSignature": "not base64!"}


@pytest.mark.parametrize(
    ("fields", "given", "expected"),
    [
        ({"sanitize_mode": "full"}, [user(), BLANK, user("")], [user()]),
        ({"sanitize_mode": "images-only"}, [user(), BLANK], [user(), BLANK]),
        (
            {"drop_thinking_blocks": True},
            [user(), {"role": "assistant", "content": [THINKING, {"type": "text", "text": "a"}]}],
            [user(), text_asst("a")],
        ),
        (
            {"sanitize_thought_signatures": True},
            [user(), {"role": "assistant", "content": [THINKING]}],
            [user(), {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}]}],
        ),
        (
            {"validate_anthropic_turns": True},
            [user("a"), user("b")],
            [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        ),
        (
            {"validate_gemini_turns": True},
            [user(), text_asst("a"), asst("c1"), res("c1")],
            [
                user(),
                {"role": "assistant", "content": [{"type": "text", "text": "a"}, call("c1")]},
                res("c1"),
            ],
        ),
        (
            {"apply_google_turn_ordering": True},
            [text_asst("a")],
            [{"role": "user", "content": "(session bootstrap)"}, text_asst("a")],
        ),
    ],
)
def test_policy_fields_act(fields: dict[str, Any], given: list[Any], expected: list[Any]) -> None:
    assert repair_transcript(given, TranscriptPolicy(**fields)).messages == expected


def test_preserve_signatures_is_gone() -> None:
    with pytest.raises(ConfigError):
        resolve_policy("anthropic", overrides={"preserve_signatures": True})


# -- 8. OpenClaw's synthetic results are placeholders --------------------------------


@pytest.mark.parametrize(
    ("placeholder", "synthetic"),
    [
        (res("c1", OPENCLAW_TEXT) | {"isError": True}, True),
        (res("c1", "x") | {"isError": True, "details": {"openclawSyntheticMissingToolResult": True}}, True),
        ({"role": "toolResult", "toolCallId": "c1", "content": OPENCLAW_TEXT, "isError": True}, True),
        (
            {"role": "toolResult", "toolCallId": "c1", "content": [{"type": "text", "text": OPENCLAW_TEXT}]},
            True,
        ),
        (res("c1", OPENCLAW_TEXT) | {"isError": False}, False),
        (res("c1", OPENCLAW_TEXT + ".") | {"isError": True}, False),
    ],
)
def test_reference_placeholders_give_way_to_a_real_result(
    placeholder: dict[str, Any], synthetic: bool
) -> None:
    assert is_synthetic(placeholder) is synthetic
    repaired = repair_pairing([asst("c1"), placeholder, user(), res("c1", "real")]).messages
    kept = repaired[1]
    assert (kept["content"] == [{"type": "text", "text": "real"}]) is synthetic


def test_openclaw_placeholder_replaced_in_anthropic_wire() -> None:
    wire = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": OPENCLAW_TEXT, "is_error": True}
            ],
        },
        {"role": "user", "content": "hm"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "real"}]},
    ]
    out = repair_wire("anthropic", wire)
    assert out[2]["content"][0]["content"] == "real"


def test_gemini_duplicate_answer_of_a_shared_id_never_goes_to_the_other_name() -> None:
    # Found by the deep property run: a second "exec" answer went to the unanswered "read" call.
    wire = [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [_fcall("read", "x"), _fcall("read", "y"), _fcall("exec", "x")]},
        {
            "role": "user",
            "parts": [_fresp("read", "R", "y"), _fresp("exec", "E", "x"), _fresp("exec", "E2", "x")],
        },
    ]
    assert _answers(repair_wire("gemini", wire)) == [("read", "synthetic"), ("read", "R"), ("exec", "E")]
