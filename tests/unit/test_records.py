"""One schema per Redis record: the declarations, the Lua scripts held to them, and reading by name."""

from __future__ import annotations

import enum
import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

import workers.store.keys
from workers.core.models import CallState, ClaimStatus
from workers.core.run_health import RunStatus
from workers.errors import StoreError
from workers.store.keys import KEY_PATTERNS
from workers.store.records import (
    CALL,
    HASH_RECORDS,
    KEY_RECORDS,
    LANE,
    REQUIRED,
    RUN,
    WATCHDOG,
    CallField,
    FieldType,
    HashRecord,
    KeyRecord,
    LaneField,
    Row,
    RunField,
    WatchdogField,
    declared_field,
    pgid_field,
    pgid_of,
    reply_member,
    schema_table,
)

# --- the Lua scripts name declared fields only -----------------------------------------------

LUA_TOKEN = re.compile(
    r"""--\[(?P<level>=*)\[.*?\](?P=level)\]   # block comment
      | --[^\n]*                               # line comment
      | (?P<string>'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*")
      | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<concat>\.\.)
      | (?P<punct>[^\sA-Za-z_])
    """,
    re.VERBOSE | re.DOTALL,
)

# Where each hash command takes field names: one position, every argument from 2 on, or
# every other one (field, value, field, value, ...).
FIELD_ARGS: dict[str, str] = {
    "HGET": "one",
    "HEXISTS": "one",
    "HSETNX": "one",
    "HINCRBY": "one",
    "HINCRBYFLOAT": "one",
    "HSTRLEN": "one",
    "HMGET": "rest",
    "HDEL": "rest",
    "HSET": "pairs",
    "HMSET": "pairs",
}


@dataclass(frozen=True)
class LuaField:
    """A literal field name (or the literal prefix of a built one, ``'loop_warn:' .. key``)."""

    line: int
    command: str
    name: str


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    line: int


def _lua_tokens(source: str) -> list[_Token]:
    tokens = []
    for match in LUA_TOKEN.finditer(source):
        kind = match.lastgroup
        if kind in (None, "level"):
            continue  # a comment
        line = source.count("\n", 0, match.start()) + 1
        tokens.append(_Token(kind, match.group(kind), line))
    return tokens


def _call_args(tokens: list[_Token], start: int) -> list[list[_Token]]:
    """The top-level arguments of the call whose ``(`` is at ``start``."""
    args: list[list[_Token]] = [[]]
    depth = 0
    for token in tokens[start:]:
        if token.text in "({[" and token.kind == "punct":
            depth += 1
            if depth == 1:
                continue
        elif token.text in ")}]" and token.kind == "punct":
            depth -= 1
            if depth == 0:
                break
        if depth == 1 and token.kind == "punct" and token.text == ",":
            args.append([])
        else:
            args[-1].append(token)
    return args


def _literal(arg: list[_Token]) -> str | None:
    """A string literal argument's text, or the literal head of a concatenation."""
    if arg and arg[0].kind == "string" and (len(arg) == 1 or arg[1].kind == "concat"):
        return arg[0].text[1:-1]
    return None


def lua_hash_fields(source: str) -> list[LuaField]:
    """Every literal field name passed to a hash command in ``redis.call``/``redis.pcall``."""
    tokens = _lua_tokens(source)
    found = []
    for n in range(len(tokens) - 3):
        head = [t.text for t in tokens[n : n + 4]]
        if head[:2] != ["redis", "."] or head[2] not in ("call", "pcall") or head[3] != "(":
            continue
        args = _call_args(tokens, n + 3)
        command = (_literal(args[0]) or "").upper()
        shape = FIELD_ARGS.get(command)
        if shape is None:
            continue
        positions = {"one": [2], "rest": range(2, len(args)), "pairs": range(2, len(args), 2)}[shape]
        for position in positions:
            if position < len(args) and (name := _literal(args[position])) is not None:
                found.append(LuaField(args[position][0].line, command, name))
    return found


def _scripts() -> dict[str, str]:
    folder = resources.files("workers.store").joinpath("scripts")
    return {p.name: p.read_text(encoding="utf-8") for p in folder.iterdir() if p.name.endswith(".lua")}


def test_every_field_a_lua_script_names_is_declared() -> None:
    # Given every script the store ships
    scripts = _scripts()
    assert len(scripts) > 15
    # When the literal field names of their hash commands are extracted
    fields = {name: lua_hash_fields(source) for name, source in scripts.items()}
    # Then the extractor saw the scripts' fields, and each is declared for some record
    assert sum(len(found) for found in fields.values()) > 60
    undeclared = [
        f"{name}:{f.line}: {f.command} {f.name!r}" for name, found in fields.items() for f in found
        if not declared_field(f.name)
    ]  # fmt: skip
    assert undeclared == []


SAMPLE_SCRIPT = """
-- 'commented_out' in HSET: redis.call('HSET', KEYS[1], 'commented_out', 1)
--[[ redis.call('HGET', KEYS[1], 'in_a_block_comment') ]]
if redis.call("HGET", KEYS[1], "state") ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'done',
           'made_up_ms', ARGV[1], 'result', cjson.encode({a = 'x, y'}))
redis.call('hincrby', KEYS[2], 'loop_warn:' .. ARGV[2], tonumber(ARGV[3]))
redis.call('HMGET', KEYS[1], 'tool', 'also_made_up')
redis.call('HMGET', KEYS[1], unpack(ARGV))
redis.call('ZADD', KEYS[3], 1, 'not_a_field')
"""


def test_the_lua_extractor_finds_a_made_up_field() -> None:
    # When the sample script's fields are extracted
    found = lua_hash_fields(SAMPLE_SCRIPT)
    # Then every literal field is found, values, comments and other commands are not
    assert [(f.line, f.command, f.name) for f in found] == [
        (4, "HGET", "state"),
        (5, "HSET", "state"),
        (6, "HSET", "made_up_ms"),
        (6, "HSET", "result"),
        (7, "HINCRBY", "loop_warn:"),
        (8, "HMGET", "tool"),
        (8, "HMGET", "also_made_up"),
    ]
    # and the made-up ones are exactly those the check reports
    assert [f.name for f in found if not declared_field(f.name)] == ["made_up_ms", "also_made_up"]


# --- the declarations are complete and consistent --------------------------------------------

NUMBER_TYPES = (FieldType.MS, FieldType.INT, FieldType.FLAG)


@pytest.mark.parametrize("record", HASH_RECORDS, ids=lambda r: r.name)
def test_every_field_name_has_one_declaration(record: HashRecord[Any]) -> None:
    enums: set[type[enum.StrEnum]] = {type(name) for name in record.fields}
    assert len(enums) == 1
    assert {*enums.pop()} == set(record.fields)


@pytest.mark.parametrize(
    ("record", "name"), [(r, n) for r in HASH_RECORDS for n in r.fields], ids=lambda x: getattr(x, "name", x)
)
def test_each_default_fits_its_type(record: HashRecord[Any], name: enum.StrEnum) -> None:
    spec = record.fields[name]
    assert spec.meaning
    if spec.default is REQUIRED:
        return
    if spec.kind in NUMBER_TYPES:
        assert type(spec.default) is int
    elif spec.kind is FieldType.ENUM and spec.values is not None and spec.default != "":
        assert spec.values(str(spec.default)) == spec.default
    else:
        assert isinstance(spec.default, str)


# The placeholders of the declared key patterns, as the sample key builders below fill them in.
SAMPLE_PARTS = {
    "{tag}": "{S/R}",
    "{S}": "{S}",
    "{B}": "{" + workers.store.keys.bucket_tag(0) + "}",
    "<call>": "C",
    "<session>": "S",
    "<tool>": "T",
    "<id>": "C",
    "<outcome>": "C",
    "<queue>": "Q",
}
RECORDS: list[HashRecord[Any] | KeyRecord] = [*HASH_RECORDS, *KEY_RECORDS]
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
RENDERED = re.compile(r"<!-- rendered from [^>]*-->\n(.*?)<!-- end of the rendered key schema -->", re.DOTALL)


def sample_of(pattern: str) -> str:
    """A declared key pattern with the sample session ``S``, run ``R`` and call ``C``."""
    for placeholder, sample in SAMPLE_PARTS.items():
        pattern = pattern.replace(placeholder, sample)
    return pattern


def sample_key(builder: str) -> str:
    """The key a declaration's builder makes for prefix ``P``, session ``S``, run ``R``, call ``C``."""
    owner, _, attribute = builder.partition(".")
    assert owner in workers.store.keys.__all__
    made: Any
    if owner == "RunKeys":
        made = workers.store.keys.RunKeys("P", "S", "R")
    elif owner == "SessionKeys":
        made = workers.store.keys.SessionKeys("P", "S")
    elif owner == "BreakerKeys":
        made = workers.store.keys.BreakerKeys("P", "T")
    elif owner == "index_keys":
        made = workers.store.keys.index_keys("P", 0)
    elif owner == "OpenClawKeys":  # one OpenClaw call's record is named by session and call
        keys = workers.store.keys.OpenClawKeys("P")
        return keys.call("S", "C") if attribute == "call" else str(getattr(keys, attribute))
    elif owner == "broker_queue_key":
        made = workers.store.keys.broker_queue_key("Q")  # the broker's own key: no prefix
    elif owner == "replica_fence_key":  # the fence of a run's slot, named by one of its keys
        made = workers.store.keys.replica_fence_key(workers.store.keys.RunKeys("P", "S", "R").run)
    else:
        function = getattr(workers.store.keys, owner)
        # A key of one process (a listener's): its id is the second part, sampled ``C``.
        takes_id = len(inspect.signature(function).parameters) == 2
        made = function("P", "C") if takes_id else function("P")
    if attribute:
        made = getattr(made, attribute)
    return str(made("C") if callable(made) else made)


def mismatched(patterns: Mapping[str, str]) -> list[str]:
    """The builders whose key pattern is not the key they make."""
    return [builder for builder, pattern in patterns.items() if sample_of(pattern) != sample_key(builder)]


def test_each_key_is_declared_once_and_its_pattern_is_what_its_builder_makes() -> None:
    # Given every declaration (one per key: 8 hashes, 23 others)
    assert len(RECORDS) == 31
    # Then each names a builder of its own, every pattern keys.py shows has its declaration,
    # and each pattern is the key its builder makes
    assert sorted(r.builder for r in RECORDS) == sorted(KEY_PATTERNS)
    assert mismatched(KEY_PATTERNS) == []


def test_the_key_check_finds_a_pattern_its_builder_does_not_make() -> None:
    # Given a pattern that names another key than its builder's
    wrong = {**KEY_PATTERNS, "RunKeys.late": "P:{tag}:made_up:<call>"}
    # Then the comparison sees exactly that one
    assert mismatched(wrong) == ["RunKeys.late"]


def test_the_key_table_in_the_docs_is_the_rendered_declarations() -> None:
    # Given the table checked in to docs/architecture.md
    found = RENDERED.search(ARCHITECTURE.read_text(encoding="utf-8"))
    assert found is not None, "docs/architecture.md lost its rendered key schema"
    # Then it is exactly what the declarations render (regenerate: print schema_table())
    assert found.group(1) == schema_table()


def test_the_rendered_table_has_a_row_per_key_and_a_field_table_per_hash() -> None:
    # When the declarations are rendered
    table = schema_table()
    # Then each key is a row of the first table, and each hash's fields follow
    key_rows = [line for line in table.split("\n\n")[0].splitlines()[2:]]
    assert sorted(row.split(" | ")[0] for row in key_rows) == sorted(f"| `{r.key}`" for r in RECORDS)
    for record in HASH_RECORDS:
        assert f"**{record.name}** (`{record.key}`)" in table
        assert all(f"| `{name}` |" in table for name in record.fields)


def test_field_families_are_declared_by_prefix() -> None:
    assert declared_field(pgid_field(4242))
    assert pgid_of(pgid_field(4242)) == 4242
    assert pgid_of(CallField.TOOL) is None
    assert declared_field("loop_warn:stuck:exec")
    assert not declared_field("made_up")


# --- reading by name -------------------------------------------------------------------------


def test_a_row_zips_an_hmget_reply_to_names() -> None:
    # Given an HMGET reply of three call fields in the declared order, one missing
    names = [CallField.STATE, CallField.SUBMITTED_MS, CallField.STARTED_MS]
    row = Row.zip(CALL, names, ["running", "1700", None])
    # Then each is read by name, and the missing one gets its declared default
    assert row.member(CallField.STATE, CallState) is CallState.RUNNING
    assert row.integer(CallField.SUBMITTED_MS) == 1700
    assert row.integer(CallField.STARTED_MS) == 0
    assert row.maybe_integer(CallField.STARTED_MS) is None
    assert CallField.STARTED_MS not in row


def test_a_reply_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="shorter"):
        Row.zip(CALL, [CallField.STATE, CallField.TOOL], ["running"])


def test_defaults_are_the_declared_ones() -> None:
    call, run, watchdog = Row(CALL, {}), Row(RUN, {}), Row(WATCHDOG, {})
    assert not call
    assert call.member(CallField.STATE, CallState) is CallState.PENDING
    assert call.flag(CallField.DISPATCHED) is False
    assert call.text(CallField.REASON) == ""
    assert run.text(RunField.STATUS) == ""
    assert watchdog.integer(WatchdogField.LAST_GAP_MS) == -1


def test_a_missing_required_field_is_a_store_error() -> None:
    # Given a lane record without its fencing token (every lane is written with one)
    lane = Row(LANE, {"run_id": "r1", "since_ms": "5"}, where="unstuck:{s}:lane")
    # Then reading the token raises instead of reading 0
    assert lane.text(LaneField.RUN_ID) == "r1"
    with pytest.raises(StoreError, match=r"unstuck:\{s\}:lane: the lane record has no valid token"):
        lane.integer(LaneField.TOKEN)


def test_a_malformed_number_reads_as_missing() -> None:
    # As the scripts' tonumber(x or 0) or 0 does, so both sweep paths decide alike
    row = Row(CALL, {b"deadline_ms": b"soon", "attempt": "2"})
    assert row.integer(CallField.DEADLINE_MS) == 0
    assert row.integer(CallField.ATTEMPT) == 2
    with pytest.raises(StoreError):
        Row(LANE, {"token": "x"}).integer(LaneField.TOKEN)


def test_an_enum_value_outside_its_enum_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="not a CallState"):
        Row(CALL, {"state": "exploded"}).member(CallField.STATE, CallState)
    with pytest.raises(StoreError, match="not a RunStatus"):
        Row(RUN, {}).member(RunField.STATUS, RunStatus)  # missing reads '', which no run status is


def test_a_script_reply_becomes_its_enum_or_a_store_error() -> None:
    assert reply_member(ClaimStatus, b"busy", where="ledger_claim.lua") is ClaimStatus.BUSY
    with pytest.raises(StoreError, match=r"ledger_claim\.lua returned 'exploded', not a ClaimStatus"):
        reply_member(ClaimStatus, "exploded", where="ledger_claim.lua")
