"""Hashing rules: stable args hash and the outcome-hash precedence."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from workers.core.loops import UNDEFINED, hash_args, hash_outcome, normalize_tool_name
from workers.core.loops.hashing import is_loop_veto, stable_stringify


def _result(text: str = "", **details: Any) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "details": details}


def _same(tool: str, args: Any, first: Any, second: Any, *, is_error: bool = False) -> bool:
    one = hash_outcome(tool, args, first, is_error=is_error).result_hash
    two = hash_outcome(tool, args, second, is_error=is_error).result_hash
    assert one is not None
    assert two is not None
    return one == two


@pytest.mark.parametrize(
    ("name", "normal"),
    [("Bash", "exec"), ("apply-patch", "apply_patch"), ("", "tool"), ("READ", "read"), ("exec", "exec")],
)
def test_tool_names_are_normalised(name: str, normal: str) -> None:
    assert normalize_tool_name(name) == normal


def test_args_hash_ignores_key_order_at_every_level_and_includes_the_tool() -> None:
    # Given / When
    one = hash_args("read", {"a": 1, "b": {"x": [1, 2], "y": None}})
    two = hash_args("read", {"b": {"y": None, "x": [1, 2]}, "a": 1})
    # Then
    assert one == two
    assert one.startswith("read:")
    assert len(one) == len("read:") + 64
    assert hash_args("write", {"a": 1}) != hash_args("read", {"a": 1})
    assert hash_args("read", [1, 2]) != hash_args("read", [2, 1])


@pytest.mark.parametrize("args", ["text", 42, None, 1.5, [], True])
def test_args_hash_works_for_non_object_args(args: Any) -> None:
    assert hash_args("t", args) == hash_args("t", args)
    assert hash_args("t", args) != hash_args("t", {"v": args})


def test_stable_serialisation_details() -> None:
    assert stable_stringify({"b": 1, "a": UNDEFINED}) == '{"a":undefined,"b":1}'
    assert stable_stringify(1.0) == stable_stringify(1)
    assert stable_stringify(float("inf")) == '"Infinity"'
    assert stable_stringify(b"\x00\x01") == '"AAE="'
    cyclic: dict[str, Any] = {"a": 1}
    cyclic["self"] = cyclic
    assert stable_stringify(cyclic) == '{"a":1,"self":"[Circular]"}'
    shared = {"k": 1}
    assert stable_stringify([shared, shared]) == '[{"k":1},{"k":1}]'


@pytest.mark.parametrize(
    ("message", "unknown"),
    [
        ("Unknown tool: Web_Fetch", "web_fetch"),
        ("unknown tool 'foo.bar'", "foo.bar"),
        ('Tool "browser" not found', "browser"),
        ("tool x-y is not available", "x-y"),
        ("permission denied", None),
    ],
)
def test_thrown_errors_hash_by_message_and_extract_unknown_tool(message: str, unknown: str | None) -> None:
    outcome = hash_outcome("t", {}, message, is_error=True)
    assert outcome.result_hash is not None
    assert outcome.result_hash.startswith("error:")
    assert outcome.unknown_tool_name == unknown


def test_thrown_error_objects_and_scalars() -> None:
    assert _same("t", {}, ValueError("boom"), "boom", is_error=True)
    assert _same("t", {}, 5, "5", is_error=True)
    assert not _same("t", {}, "a", "b", is_error=True)


@pytest.mark.parametrize(
    ("first", "second", "equal"),
    [("x", "x", True), ([1], [1], True), ("x", "y", False), (None, "null", False)],
)
def test_non_object_results_hash_their_stable_form(first: Any, second: Any, equal: bool) -> None:
    assert _same("t", {}, first, second) is equal


def test_undefined_result_and_loop_veto_give_no_hash() -> None:
    veto = _result("blocked", status="blocked", deniedReason="tool-loop")
    assert is_loop_veto(veto)
    assert hash_outcome("t", {}, veto).result_hash is None
    assert hash_outcome("t", {}, UNDEFINED).result_hash is None


def test_other_blocked_results_hash_normally() -> None:
    denial = _result("denied", status="blocked", deniedReason="approval")
    assert hash_outcome("t", {}, denial).result_hash is not None


def test_exec_running_ignores_text_pid_session_cwd() -> None:
    one = _result(
        "started pid 1", status="running", tail="compiling", pid=1, sessionId="a", cwd="/a", startedAt=1
    )
    two = _result(
        "started pid 2", status="running", tail="compiling", pid=2, sessionId="b", cwd="/b", startedAt=2
    )
    assert _same("exec", {}, one, two)
    assert not _same("exec", {}, one, _result("x", status="running", tail="linking"))


def test_exec_finished_ignores_duration_cwd_pid_session() -> None:
    one = _result(
        "a", status="failed", exitCode=1, aggregated="FAIL", durationMs=5, cwd="/a", pid=1, sessionId="s"
    )
    two = _result(
        "b", status="failed", exitCode=1, aggregated="FAIL", durationMs=9, cwd="/b", pid=2, sessionId="t"
    )
    assert _same("exec", {}, one, two)
    assert not _same("exec", {}, one, _result("a", status="failed", exitCode=2, aggregated="FAIL"))
    assert not _same(
        "exec", {}, one, _result("a", status="failed", exitCode=1, aggregated="FAIL", timedOut=True)
    )


def test_exec_empty_aggregated_uses_text() -> None:
    assert not _same(
        "exec",
        {},
        _result("1", status="completed", aggregated=""),
        _result("2", status="completed", aggregated=""),
    )
    assert _same(
        "exec", {}, _result("1", status="completed", aggregated=""), _result("1", status="completed")
    )


def test_exec_approval_and_unknown_status() -> None:
    one = _result("a", status="approval-pending", reason="r", host="h", command="c", warningText="w", id=1)
    two = _result("b", status="approval-pending", reason="r", host="h", command="c", warningText="w", id=2)
    assert _same("exec", {}, one, two)
    # An unknown status falls through to the general rule, where text and details count.
    assert not _same("exec", {}, _result("a", status="queued"), _result("b", status="queued"))


@pytest.mark.parametrize("action", ["poll", "log"])
def test_process_poll_and_log_ignore_other_detail_fields(action: str) -> None:
    args = {"action": action, "sessionId": "s"}
    one = _result("out", status="running", exitCode=None, pid=1, durationMs=3)
    two = _result("out", status="running", exitCode=None, pid=2, durationMs=4)
    assert _same("process", args, one, two)
    assert not _same("process", args, one, _result("out2", status="running"))
    # Other process actions keep full hashing.
    assert not _same("process", {"action": "list"}, one, two)


def test_process_log_fields_count() -> None:
    args = {"action": "log"}
    assert not _same("process", args, _result("x", totalLines=1), _result("x", totalLines=2))


@pytest.mark.parametrize(
    ("tool", "args"),
    [("sessions_send", {}), ("message", {"action": "send"}), ("message", {"action": "reply"})],
)
def test_send_results_strip_volatile_ids_and_ignore_text(tool: str, args: dict[str, Any]) -> None:
    one = _result("sent 1", ok=True, messageId="m1", ts=1, nested={"receipt": "r1", "sentAt": 5}, runId="a")
    two = _result("sent 2", ok=True, messageId="m2", ts=2, nested={"receipt": "r2", "sentAt": 6}, runId="b")
    assert _same(tool, args, one, two)
    assert not _same(tool, args, one, _result("sent 1", ok=False, messageId="m1"))


@pytest.mark.parametrize(
    ("shape", "equal"),
    [
        (lambda i: {"msg": {"id": f"d{i}", "text": "hi", "senderId": "me"}}, True),
        (lambda i: {"msg": {"id": f"d{i}", "text": "hi", "direction": "out"}}, True),
        (lambda i: {"route": {"id": f"r{i}", "text": "hi"}}, False),
        (lambda i: {"msg": {"id": "d", "text": "hi", "conversation": {"id": f"c{i}"}}}, False),
    ],
    ids=["delivery-sender", "delivery-direction", "route-id-survives", "conversation-id-survives"],
)
def test_send_strips_bare_id_only_on_delivery_objects(
    shape: Callable[[int], dict[str, Any]], equal: bool
) -> None:
    args = {"action": "send"}
    assert _same("message", args, _result(**shape(1)), _result(**shape(2))) is equal


def test_non_send_message_actions_keep_full_hashing() -> None:
    args = {"action": "read"}
    assert not _same("message", args, _result("x", messageId="m1"), _result("x", messageId="m2"))


def test_provider_send_tools_are_configurable() -> None:
    one, two = _result("a", messageId="1"), _result("b", messageId="2")
    first = hash_outcome("telegram", {}, one, send_tools=frozenset({"telegram"})).result_hash
    second = hash_outcome("telegram", {}, two, send_tools=frozenset({"telegram"})).result_hash
    assert first == second
    assert not _same("telegram", {}, one, two)


def test_general_rule_hashes_details_and_joined_text() -> None:
    assert _same("read", {}, _result(" a ", k=1), _result("a", k=1))
    assert not _same("read", {}, _result("a", k=1), _result("a", k=2))
    multi = {
        "content": [
            {"type": "text", "text": "a"},
            {"type": "image", "data": "x"},
            {"type": "text", "text": "b"},
        ]
    }
    assert _same("read", {}, multi, {"content": [{"type": "text", "text": "a\nb"}]})
