"""Property tests: for any transcript, repair yields what every provider accepts, and is stable."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.transcript.factories import asst, call, res, syn, text_asst, user
from workers.core.transcript import is_synthetic, repair_pairing, repair_transcript, resolve_policy
from workers.core.transcript.adapters import encode
from workers.core.transcript.model import call_blocks, result_id

IDS = st.sampled_from(["c0", "c1", "c2", "c_3"])
STOPS = st.sampled_from([None, "toolUse", "stop", "error", "aborted"])
PROVIDERS = st.sampled_from(
    [("anthropic", None), ("openai", "openai-responses"), ("mistral", None), ("google", None)]
)

messages_strategy = st.one_of(
    st.builds(user, st.sampled_from(["a", "b"])),
    st.builds(text_asst),
    st.builds(
        lambda ids, stop: asst(*[call(i) for i in ids], stop=stop),
        st.lists(IDS, min_size=1, max_size=3),
        STOPS,
    ),
    st.builds(lambda i, text: res(i, text), st.one_of(st.none(), IDS), st.sampled_from(["r1", "r2"])),
    st.builds(syn, IDS),
)
transcripts = st.lists(messages_strategy, max_size=14)


def assert_every_call_answered_once_right_after_its_turn(messages: list[Any]) -> None:
    """The pairing rule every provider enforces, on the neutral form."""
    answered: set[int] = set()
    for index, message in enumerate(messages):
        calls = call_blocks(message)
        if not calls:
            continue
        following = messages[index + 1 : index + 1 + len(calls)]
        assert [result_id(m) for m in following] == [call_id for call_id, _ in calls]
        answered.update(range(index + 1, index + 1 + len(calls)))
    results = {i for i, m in enumerate(messages) if m.get("role") == "toolResult"}
    assert results == answered


def assert_anthropic_accepts(messages: list[Any]) -> None:
    wire = encode("anthropic", messages, [])
    for index, message in enumerate(wire):
        uses = [b["id"] for b in message["content"] if isinstance(b, dict) and b.get("type") == "tool_use"]
        nxt = wire[index + 1]["content"] if index + 1 < len(wire) else []
        answers = [b["tool_use_id"] for b in nxt if isinstance(b, dict) and b.get("type") == "tool_result"]
        assert Counter(uses) == Counter(answers) if uses else True
        if message["role"] == "user" and isinstance(message["content"], list):
            own = [b["tool_use_id"] for b in message["content"] if b.get("type") == "tool_result"]
            prev = wire[index - 1]["content"] if index else []
            prev_ids = [b["id"] for b in prev if isinstance(b, dict) and b.get("type") == "tool_use"]
            assert Counter(own) == Counter(prev_ids) if own else True


def assert_openai_chat_accepts(messages: list[Any]) -> None:
    wire = encode("openai-chat", messages, [])
    expecting: list[str] = []
    for message in wire:
        if message["role"] == "tool":
            assert expecting
            assert message["tool_call_id"] == expecting.pop(0)
            continue
        assert not expecting
        expecting = [c["id"] for c in message.get("tool_calls", [])]
    assert not expecting


@settings(max_examples=300, deadline=None)
@given(transcripts)
def test_repair_with_drop_satisfies_every_provider(messages: list[Any]) -> None:
    repaired = repair_pairing(messages, errored_turns="drop").messages
    assert_every_call_answered_once_right_after_its_turn(repaired)
    assert_anthropic_accepts(repaired)
    assert_openai_chat_accepts(repaired)


@settings(max_examples=300, deadline=None)
@given(transcripts, st.sampled_from(["preserve", "drop"]))
def test_repair_is_idempotent(messages: list[Any], errored: Any) -> None:
    once = repair_pairing(messages, errored_turns=errored).messages
    assert repair_pairing(once, errored_turns=errored).messages is once


@settings(max_examples=200, deadline=None)
@given(transcripts, PROVIDERS)
def test_full_pipeline_for_each_provider(messages: list[Any], provider: tuple[str, str | None]) -> None:
    policy = resolve_policy(*provider)
    once = repair_transcript(messages, policy).messages
    assert_every_call_answered_once_right_after_its_turn(once)
    assert repair_transcript(once, policy).messages is once


@settings(max_examples=300, deadline=None)
@given(transcripts, st.sampled_from(["preserve", "drop"]), st.sampled_from(["legacy", "by_name"]))
def test_no_real_result_of_a_surviving_call_is_dropped(
    messages: list[Any], errored: Any, idless: Any
) -> None:
    # Given calls whose id is used by exactly one call in the whole transcript
    repaired = repair_pairing(messages, errored_turns=errored, idless=idless)
    call_counts = Counter(call_id for m in messages for call_id, _ in call_blocks(m))
    for index, message in enumerate(messages):
        for call_id, _ in call_blocks(message):
            later_real = [
                m
                for m in messages[index + 1 :]
                if m.get("role") == "toolResult" and result_id(m) == call_id and not is_synthetic(m)
            ]
            survives = any(m is message for m in repaired.messages)
            if call_counts[call_id] != 1 or not later_real or not survives:
                continue
            # Then its first real result is what the output holds for it, unless (OpenClaw's
            # legacy id fill) an id-less result its own turn adopted first holds it, as an error
            kept = [m for m in repaired.messages if m.get("role") == "toolResult" and result_id(m) == call_id]
            if idless == "legacy" and kept != [later_real[0]]:
                assert len(kept) == 1
                assert kept[0]["isError"] is True
                assert any(result_id(m) is None and m | {"toolCallId": call_id, "isError": True} == kept[0]
                           for m in messages[index + 1 :])  # fmt: skip
                continue
            assert kept == [later_real[0]]
