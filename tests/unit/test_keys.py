"""Redis key builders: one hash tag per run whatever the ids contain, and due-index round trips."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.store.keys import (
    INDEX_BUCKETS,
    RunKeys,
    SessionKeys,
    all_index_keys,
    bucket_tag,
    index_keys,
    key_slot,
    ledger_key_kind,
    ledger_scan_pattern,
    member_bucket,
    member_run_key,
    parse_due_member,
    quote_part,
    run_member,
)

PREFIX = "unstuck"

# Any text a caller may send, including the characters of the key grammar (lone surrogates cannot
# come out of a JSON request body as UTF-8, so they are left out).
ids = st.text(st.characters(codec="utf-8"), max_size=40)
nasty = st.text(st.sampled_from("{}:/%~ab\u00e9\u4e2d"), max_size=12)
any_id = st.one_of(ids, nasty)


def redis_hash_tag(key: str) -> str:
    """The part of ``key`` Redis Cluster hashes: between the first '{' and the next '}', if non-empty."""
    start = key.find("{")
    if start == -1:
        return key
    end = key.find("}", start + 1)
    if end == -1 or end == start + 1:
        return key
    return key[start + 1 : end]


def all_keys(keys: RunKeys, call_id: str) -> list[str]:
    return [
        keys.call(call_id),
        keys.late(call_id),
        keys.lease(call_id),
        keys.calls,
        keys.done,
        keys.history,
        keys.run,
    ]


@pytest.mark.parametrize(
    ("session", "run"),
    [
        ("s1", "r1"),
        ("agent:main:{telegram}/chat", "run/1"),
        ("}", "{"),
        ("{x}", ""),
        ("a:b", "c:d"),
        ("%7B", "%"),
    ],
)
def test_examples_share_one_hash_tag(session: str, run: str) -> None:
    # Given
    keys = RunKeys(PREFIX, session, run)
    # When
    tags = {redis_hash_tag(key) for key in all_keys(keys, "call:{1}/2")}
    # Then
    assert tags == {f"{quote_part(session)}/{quote_part(run)}"}
    assert keys.tag == "{" + tags.pop() + "}"


def test_key_layout() -> None:
    keys = RunKeys(PREFIX, "s:1", "r{1}")
    assert keys.call("c/1") == "unstuck:{s%3A1/r%7B1%7D}:call:c%2F1"
    assert keys.lease("c") == "unstuck:{s%3A1/r%7B1%7D}:lease:c"
    assert keys.calls == "unstuck:{s%3A1/r%7B1%7D}:calls"
    assert index_keys(PREFIX, 0).due == "unstuck:{" + bucket_tag(0) + "}:due"


@settings(max_examples=50)
@given(session=any_id, run=any_id, call_id=any_id)
def test_all_keys_of_a_run_share_one_tag_whatever_the_ids(session: str, run: str, call_id: str) -> None:
    keys = RunKeys(PREFIX, session, run)
    tags = {redis_hash_tag(key) for key in all_keys(keys, call_id)}
    assert tags == {keys.tag[1:-1]}


@settings(max_examples=50)
@given(session=any_id, run=any_id, call_id=any_id)
def test_user_ids_cannot_add_key_grammar(session: str, run: str, call_id: str) -> None:
    # The quoted parts contain none of the grammar's separators, so every key splits the same way.
    keys = RunKeys(PREFIX, session, run)
    for part in (quote_part(session), quote_part(run), quote_part(call_id)):
        assert not set(part) & set("{}:/")
    assert keys.call(call_id).split(":") == [PREFIX, keys.tag, "call", quote_part(call_id)]
    assert keys.tag.count("/") == 1


@given(value=st.one_of(any_id, st.text(st.sampled_from("aZ09-_.~@ +%"), max_size=12)))
def test_a_part_is_quoted_as_quote_quotes_it(value: str) -> None:
    # quote_part skips quote() for text it would leave as it is: the two must never differ.
    assert quote_part(value) == quote(value, safe="-_.~@")


@settings(max_examples=50)
@given(a=st.tuples(any_id, any_id), b=st.tuples(any_id, any_id))
def test_different_runs_get_different_tags(a: tuple[str, str], b: tuple[str, str]) -> None:
    if a != b:
        assert RunKeys(PREFIX, *a).tag != RunKeys(PREFIX, *b).tag


@settings(max_examples=50)
@given(session=any_id, run=any_id, call_id=any_id)
def test_due_member_round_trips(session: str, run: str, call_id: str) -> None:
    # Given
    keys = RunKeys(PREFIX, session, run)
    # When
    parsed_keys, parsed_call = parse_due_member(PREFIX, keys.due_member(call_id))
    # Then
    assert (parsed_keys, parsed_call) == (keys, call_id)
    assert parsed_keys.call(parsed_call) == keys.call(call_id)


@settings(max_examples=50)
@given(a=st.tuples(any_id, any_id, any_id), b=st.tuples(any_id, any_id, any_id))
def test_due_members_do_not_collide(a: tuple[str, str, str], b: tuple[str, str, str]) -> None:
    if a != b:
        assert RunKeys(PREFIX, a[0], a[1]).due_member(a[2]) != RunKeys(PREFIX, b[0], b[1]).due_member(b[2])


@settings(max_examples=50)
@given(session=any_id, run=any_id, call_id=any_id)
def test_scanned_keys_are_classified_from_the_builders(session: str, run: str, call_id: str) -> None:
    # Given every key of a run, of its session and of the run indexes
    keys = RunKeys(PREFIX, session, run)
    others = [k for k in all_keys(keys, call_id) if k not in (keys.call(call_id), keys.run)]
    others += [SessionKeys(PREFIX, session).lane, keys.index.by_deadline]
    # Then only call and run records are told apart, and the scan pattern's prefix matches them all
    assert ledger_key_kind(keys.call(call_id)) == "call"
    assert ledger_key_kind(keys.run) == "run"
    assert [ledger_key_kind(k) for k in others] == [None] * len(others)
    assert all(k.startswith(ledger_scan_pattern(PREFIX).rstrip("*")) for k in [keys.run, *others])


def test_bucket_tags_sit_in_their_share_of_the_slot_space() -> None:
    # Each bucket's slot lies in the bucket's 1/INDEX_BUCKETS of the slots: spread evenly over shards.
    share = 16384 // INDEX_BUCKETS
    slots = [key_slot(redis_hash_tag(keys.due)) for keys in all_index_keys(PREFIX)]
    assert [slot // share for slot in slots] == list(range(INDEX_BUCKETS))
    for keys in all_index_keys(PREFIX):
        assert {
            redis_hash_tag(k) for k in (keys.due, keys.leases, keys.by_deadline, keys.by_progress, keys.ended)
        } == {bucket_tag(keys.bucket)}


@settings(max_examples=50)
@given(session=any_id, run=any_id, call_id=any_id)
def test_a_run_and_its_members_map_to_one_bucket_near_its_slot(session: str, run: str, call_id: str) -> None:
    # Given
    keys = RunKeys(PREFIX, session, run)
    # Then the run, its run member and its call members agree on the bucket, which shares the run's slot range
    assert member_bucket(run_member(session, run)) == member_bucket(keys.due_member(call_id)) == keys.bucket
    assert key_slot(keys.tag[1:-1]) * INDEX_BUCKETS // 16384 == keys.bucket
    assert keys.index == index_keys(PREFIX, keys.bucket)
    # And the sweep rebuilds the run's keys from members exactly as the builders spell them
    assert member_run_key(PREFIX, run_member(session, run)) == keys.run
