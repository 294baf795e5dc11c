"""Done signals: a call id and its result, read back whatever the id holds; bare ids still read."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from workers.core.models import ToolCall, ToolResult
from workers.core.results import success_result
from workers.store.done_signals import Mailbox
from workers.store.ledger import HANDED_BACK, SEPARATOR, Signal, encode, results_of

# Call ids are any string of up to 256 characters, the markers included.
call_ids = st.text(st.characters(codec="utf-8"), min_size=1, max_size=256)
nasty_ids = st.text(st.sampled_from([SEPARATOR, HANDED_BACK, "{", "}", '"', ":", "a", "\u00e9"]), min_size=1)
any_id = st.one_of(call_ids, nasty_ids)
texts = st.text(st.characters(codec="utf-8"), max_size=50)


def _result(call_id: str, text: str = "ok") -> ToolResult:
    return success_result(ToolCall(id=call_id, name="echo"), text, elapsed_ms=5, attempt=1)


@given(any_id, texts)
def test_a_signal_reads_back_as_its_call_and_result(call_id: str, text: str) -> None:
    result = _result(call_id, text)
    signal = Signal.parse(encode(call_id, result.to_json()))
    assert (signal.call_id, signal.result, signal.handed_back) == (call_id, result.to_json(), False)
    assert signal.answer() == result


@given(any_id, texts)
def test_a_handed_back_signal_keeps_its_result(call_id: str, text: str) -> None:
    result = _result(call_id, text)
    raw = encode(call_id, result.to_json())
    handed = Signal.parse(Signal.parse(raw).marked())
    assert handed.handed_back
    assert (handed.call_id, handed.answer()) == (call_id, result)


@given(texts)
def test_result_json_never_holds_the_separator_nor_starts_with_the_mark(text: str) -> None:
    # What makes the first separator the split and the mark unambiguous, whatever the id.
    raw = _result("c", text + SEPARATOR).to_json()
    assert SEPARATOR not in raw
    assert not raw.startswith(HANDED_BACK)


# A bare id starting with the mark reads as handed back, as it always has: only the new form
# is unambiguous for every id.
@given(call_ids.filter(lambda cid: SEPARATOR not in cid and not cid.startswith(HANDED_BACK)))
def test_a_bare_id_from_an_older_worker_carries_no_result(call_id: str) -> None:
    for raw, handed_back in ((call_id, False), (HANDED_BACK + call_id, True)):
        signal = Signal.parse(raw)
        assert (signal.call_id, signal.result, signal.handed_back) == (call_id, None, handed_back)
        assert signal.answer() is None


def test_a_bare_id_holding_the_separator_never_answers_a_call() -> None:
    # Read as call "b" with "a" as its result: not a result, so the waiter reads the record.
    assert Signal.parse("a" + SEPARATOR + "b").answer() is None
    # Even a valid result is used only for the call it answers.
    assert Signal.parse(encode("a", _result("other").to_json())).answer() is None
    assert Signal.parse(_result("a").to_json() + SEPARATOR + "a").answer() == _result("a")


def test_results_of_skips_the_unanswered_and_refuses_a_stranger() -> None:
    mine = _result("a")
    assert results_of({"a": mine.to_json(), "b": None}) == {"a": mine}
    assert results_of({"b": mine.to_json()}) is None
    assert results_of({"a": "not json"}) is None


def test_a_mailbox_hands_each_kept_signal_over_once() -> None:
    mailbox = Mailbox()
    for_a, bare_b = Signal.parse(encode("a", _result("a", "for a").to_json())), Signal.parse("b")
    other_run = Signal.parse(encode("a", _result("a", "other run").to_json()))
    mailbox.put("run1:done", for_a)
    mailbox.put("run1:done", bare_b)
    mailbox.put("run2:done", other_run)
    assert mailbox.take("run1:done", ["a", "b", "c"]) == {"a": for_a, "b": bare_b}
    assert mailbox.take("run1:done", ["a", "b"]) == {}
    assert mailbox.take("run2:done", ["a"]) == {"a": other_run}


def test_a_full_mailbox_lets_its_oldest_signals_go() -> None:
    mailbox = Mailbox(limit=3)
    for call_id in "abcde":
        mailbox.put("run:done", Signal.parse(call_id))
    assert list(mailbox.take("run:done", "abcde")) == ["c", "d", "e"]
