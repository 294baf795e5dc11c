"""Pairing repair, frames algorithm: one row per rule and edge."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.transcript.factories import asst, call, res, syn, text_asst, user
from workers.core.transcript import DEFAULT_MISSING_TEXT, is_synthetic, repair_pairing

U1, U2 = user("one"), user("two")
A1 = asst("c1", "c2")
R1, R2 = res("c1", "r1"), res("c2", "r2")

# (id, input, expected output, duplicates dropped, orphans dropped)
CASES: list[tuple[str, list[Any], list[Any], int, int]] = [
    ("valid transcript untouched", [U1, A1, R1, R2, U2], [U1, A1, R1, R2, U2], 0, 0),
    ("results reordered to call order", [A1, R2, R1], [A1, R1, R2], 0, 0),
    ("displaced result moved before user", [A1, R1, U1, R2], [A1, R1, R2, U1], 0, 0),
    ("user messages keep relative order", [A1, U1, R2, U2, R1], [A1, R1, R2, U1, U2], 0, 0),
    (
        "text-only assistant does not end frame",
        [asst("c1"), text_asst(), R1],
        [asst("c1"), R1, text_asst()],
        0,
        0,
    ),
    ("duplicate: first real wins", [asst("c1"), R1, res("c1", "again")], [asst("c1"), R1], 1, 0),
    ("orphan dropped", [asst("c1"), R1, res("zz")], [asst("c1"), R1], 0, 1),
    ("result before any call is orphan", [res("c1"), U1], [U1], 0, 1),
    (
        "repeated id across turns pairs per turn",
        [asst("c1"), R1, asst("c1"), res("c1", "second")],
        [asst("c1"), R1, asst("c1"), res("c1", "second")],
        0,
        0,
    ),
    (
        "repeated id within a turn pairs FIFO",
        [asst("c1", "c1"), res("c1", "a"), res("c1", "b")],
        [asst("c1", "c1"), res("c1", "a"), res("c1", "b")],
        0,
        0,
    ),
    (
        "late result moved back across a newer turn",
        [asst("c1"), U1, asst("c2"), R2, R1],
        [asst("c1"), R1, U1, asst("c2"), R2],
        0,
        0,
    ),
    (
        "late result with two possible owners is an orphan",
        [asst("c1"), asst("c1"), asst("c3"), res("c1", "late")],
        [asst("c1"), syn("c1"), asst("c1"), syn("c1"), asst("c3"), syn("c3")],
        0,
        1,
    ),
    (
        "an id-less result adopted first holds its call against a later one with the id (OpenClaw's)",
        [asst("c1"), res(None, "legacy"), R1],
        [asst("c1"), {**res(None, "legacy"), "toolCallId": "c1", "isError": True}],
        1,
        0,
    ),
    ("real replaces synthetic in frame", [asst("c1"), syn("c1"), R1], [asst("c1"), R1], 1, 0),
    ("synthetic never replaces real", [asst("c1"), R1, syn("c1")], [asst("c1"), R1], 1, 0),
    (
        "two synthetics keep the first",
        [asst("c1"), syn("c1"), syn("c1", text="2")],
        [asst("c1"), syn("c1")],
        1,
        0,
    ),
    (
        "real result replaces synthetic across frames",
        [asst("c1"), syn("c1"), asst("c2"), R2, R1],
        [asst("c1"), R1, asst("c2"), R2],
        1,
        0,
    ),
    ("non-object entries dropped", [U1, 7, "x"], [U1], 0, 0),
    (
        "snake_case tool_use is never paired",
        [
            _snake := {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "s1", "name": "read", "input": {}}],
            }
        ],
        [_snake],
        0,
        0,
    ),
]


@pytest.mark.parametrize(
    ("given", "expected", "duplicates", "orphans"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_pairing_rule(given: list[Any], expected: list[Any], duplicates: int, orphans: int) -> None:
    # When
    result = repair_pairing(given)
    # Then
    assert result.messages == expected
    assert result.report.dropped_duplicate_count == duplicates
    assert result.report.dropped_orphan_count == orphans
    assert result.report.moved is (expected != given)


def test_missing_result_is_synthesised_in_call_position() -> None:
    # Given
    given = [asst("c1", "c2"), R2, U1]
    # When
    result = repair_pairing(given)
    # Then
    assert result.messages == [asst("c1", "c2"), syn("c1"), R2, U1]
    assert result.report.added == (syn("c1"),)
    added = result.messages[1]
    assert added["details"] == {"synthetic": True, "reason": "missing_tool_result"}
    assert added["isError"] is True


def test_missing_text_is_configurable() -> None:
    result = repair_pairing([asst("c1")], missing_text="aborted")
    assert result.messages[1]["content"] == [{"type": "text", "text": "aborted"}]
    assert is_synthetic(result.messages[1])


def test_text_that_merely_contains_the_synthetic_text_is_real() -> None:
    # Given a real error result whose text holds the synthetic text and more (placeholders match exactly)
    lookalike = res("c1", DEFAULT_MISSING_TEXT + " (copied)") | {"isError": True}
    # When a real result follows it
    result = repair_pairing([asst("c1"), lookalike, res("c1", "real")])
    # Then the look-alike is treated as real: first real wins
    assert result.messages == [asst("c1"), lookalike]
    assert not is_synthetic(lookalike)


@pytest.mark.parametrize("stop", ["error", "aborted"])
def test_errored_turn_preserved_without_synthetic(stop: str) -> None:
    given = [asst("c1", "c2", stop=stop), R1, U1]
    result = repair_pairing(given, errored_turns="preserve")
    assert result.messages is given
    assert result.report.added == ()


@pytest.mark.parametrize("stop", ["error", "aborted"])
def test_errored_turn_dropped_with_its_results(stop: str) -> None:
    given = [U1, asst("c1", stop=stop), U2, R1]
    result = repair_pairing(given, errored_turns="drop")
    assert result.messages == [U1, U2]
    assert result.report.dropped_errored_turns == 1
    assert result.report.discarded == (R1,)
    assert result.report.added == ()


def test_text_only_failed_turn_untouched() -> None:
    failed = text_asst() | {"stopReason": "error"}
    given = [U1, failed]
    assert repair_pairing(given, errored_turns="drop").messages is given


@pytest.mark.parametrize("is_error", [False, True])
def test_result_without_id_adopted_by_single_call_is_an_error_by_openclaws_legacy_id_fill(
    is_error: bool,
) -> None:
    result = repair_pairing([asst("c1"), res(None, "legacy", isError=is_error)])
    assert result.messages[1]["toolCallId"] == "c1"
    assert result.messages[1]["isError"] is True


@pytest.mark.parametrize("is_error", [False, True])
def test_result_without_id_adopted_by_name_keeps_its_kind(is_error: bool) -> None:
    result = repair_pairing([asst("c1"), res(None, "legacy", isError=is_error)], idless="by_name")
    assert result.messages[1]["toolCallId"] == "c1"
    assert result.messages[1]["isError"] is is_error


def test_by_name_a_real_result_with_its_id_beats_an_adopted_id_less_one() -> None:
    result = repair_pairing([asst("c1"), res(None, "legacy"), R1], idless="by_name")
    assert result.messages == [asst("c1"), R1]
    assert result.report.dropped_duplicate_count == 1


def test_result_without_id_not_adopted_by_name_while_an_earlier_call_of_its_name_holds_a_placeholder() -> (
    None
):
    # Given an earlier call answered only by a placeholder, then a later call of the same name
    given = [asst("c1"), syn("c1"), U1, asst("c2"), U2, res(None, "whose?")]
    # When
    result = repair_pairing(given, idless="by_name")
    # Then the id-less result could be either's: it is dropped, not given to the later call
    assert result.messages == [asst("c1"), syn("c1"), U1, asst("c2"), syn("c2"), U2]
    assert result.report.dropped_orphan_count == 1


def test_legacy_result_without_id_goes_to_the_single_call_of_its_frame_whatever_came_before() -> None:
    # Given an earlier call of the same name still unanswered, and a failed turn's call too
    failed = asst("c0", stop="error")
    given = [failed, U1, asst("c1"), syn("c1"), U1, asst("c2"), U2, res(None, "mine")]
    # When OpenClaw's legacy id fill decides (its frames attribute an id-less result locally)
    result = repair_pairing(given)
    # Then the only call of its frame adopts it, as an error; the failed turn gets no synthetic
    adopted = {**res(None, "mine"), "toolCallId": "c2", "isError": True}
    assert result.messages == [failed, U1, asst("c1"), syn("c1"), U1, asst("c2"), adopted, U2]
    assert result.report.dropped_orphan_count == 0


def test_legacy_result_without_id_outside_a_single_call_frame_is_an_orphan() -> None:
    # Given a turn of two calls answered by one id-less result after a user turn
    given = [A1, U1, res(None, "x")]
    # When / Then it is dropped, never moved by name (OpenClaw's cross-frame recovery needs an id)
    result = repair_pairing(given)
    assert result.report.dropped_orphan_count == 1
    assert [m.get("toolCallId") for m in result.messages if m["role"] == "toolResult"] == ["c1", "c2"]


def test_result_without_id_and_conflicting_name_is_orphan() -> None:
    result = repair_pairing([asst("c1"), res(None, name="write")])
    assert result.messages == [asst("c1"), syn("c1")]
    assert result.report.dropped_orphan_count == 1


@pytest.mark.parametrize(
    ("result_name", "call_name", "expected"),
    [("  read ", "read", "read"), ("", " exec ", "exec"), (" ", None, "unknown"), (None, "read", None)],
)
def test_result_names_normalised(
    result_name: str | None, call_name: str | None, expected: str | None
) -> None:
    tool_call = (
        call("c1", name=call_name)
        if call_name is not None
        else {"type": "toolCall", "id": "c1", "arguments": {}}
    )
    given = [{"role": "assistant", "content": [tool_call]}, res("c1", name=result_name)]
    result = repair_pairing(given)
    assert result.messages[1].get("toolName") == expected


def test_nothing_to_repair_returns_the_same_list() -> None:
    given = [U1, A1, R1, R2, U2]
    assert repair_pairing(given).messages is given


def test_discarded_sorted_by_original_index() -> None:
    given = [res("x"), asst("c1"), R1, res("c1", "dup"), res("y")]
    assert repair_pairing(given).report.discarded == (res("x"), res("c1", "dup"), res("y"))


def test_lookup_fills_gap_before_synthetic() -> None:
    # Given a ledger that holds the real late result of c1 but nothing for c2
    ledger = {"c1": res("c1", "from ledger")}
    seen: list[tuple[str, str]] = []

    def lookup(call_id: str, tool_name: str) -> dict[str, Any] | None:
        seen.append((call_id, tool_name))
        return ledger.get(call_id)

    # When
    result = repair_pairing([asst("c1", "c2")], lookup=lookup)
    # Then
    assert result.messages == [asst("c1", "c2"), res("c1", "from ledger"), syn("c2")]
    assert seen == [("c1", "read"), ("c2", "read")]
    assert result.report.filled_from_lookup == (res("c1", "from ledger"),)
    assert result.report.added == (syn("c2"),)


def test_lookup_not_consulted_for_failed_turn() -> None:
    def lookup(call_id: str, tool_name: str) -> dict[str, Any] | None:
        raise AssertionError("must not be called")

    given = [asst("c1", stop="aborted")]
    assert repair_pairing(given, lookup=lookup).messages is given


def test_repair_is_idempotent_on_a_messy_transcript() -> None:
    messy = [
        res("x"),
        asst("c1", "c2"),
        U1,
        R2,
        asst("c1"),
        text_asst(),
        res(None),
        R1,
        R1,
        asst("c3", stop="error"),
    ]
    once = repair_pairing(messy).messages
    assert repair_pairing(once).messages is once
