"""The loop detectors, table-driven at threshold - 1, threshold and threshold + 1."""

from __future__ import annotations

from typing import Any

import pytest

from workers.core.loops import (
    Detector,
    HistoryEntry,
    Level,
    LoopDetectionConfig,
    evaluate,
    resolve_loop_config,
)
from workers.core.loops.detectors import is_known_poll, warning_bucket

ON = resolve_loop_config({"enabled": True}, None)


def _entry(
    tool: str = "read",
    args: str = "a",
    result: str | None = "r",
    *,
    run: str | None = None,
    unknown: str | None = None,
) -> HistoryEntry:
    return HistoryEntry(0, tool, f"{tool}:{args}", run_id=run, result_hash=result, unknown_tool_name=unknown)


def _judge(
    window: list[HistoryEntry],
    tool: str = "read",
    args: str = "a",
    *,
    config: LoopDetectionConfig = ON,
    call_args: Any = None,
    run: str | None = None,
) -> tuple[str, str | None, int]:
    verdict = evaluate(
        window, tool=tool, args=call_args or {}, args_hash=f"{tool}:{args}", run_id=run, config=config
    )
    assert verdict.blocked is (verdict.level is Level.CRITICAL)
    return verdict.level.value, verdict.detector.value if verdict.detector else None, verdict.count


@pytest.mark.parametrize(
    ("copies", "expected"),
    [
        (9, ("none", None, 0)),
        (10, ("warning", "generic_repeat", 10)),
        (11, ("warning", "generic_repeat", 11)),
        (19, ("warning", "generic_repeat", 19)),
        (20, ("critical", "generic_repeat", 20)),
        (21, ("critical", "generic_repeat", 21)),
    ],
)
def test_generic_repeat_identical_outcomes(copies: int, expected: tuple[str, str | None, int]) -> None:
    assert _judge([_entry() for _ in range(copies)]) == expected


@pytest.mark.parametrize(("copies", "level"), [(19, "warning"), (20, "warning"), (30, "warning")])
def test_generic_repeat_changing_outcomes_only_warn(copies: int, level: str) -> None:
    window = [_entry(result=f"r{i}") for i in range(copies)]
    assert _judge(window) == (level, "generic_repeat", copies)


def test_generic_warning_counts_pending_records_but_critical_needs_outcomes() -> None:
    window = [_entry(result=None) for _ in range(25)]
    assert _judge(window) == ("warning", "generic_repeat", 25)


def test_no_progress_skips_interleaved_calls_and_stops_at_a_different_outcome() -> None:
    # Given 5 old outcomes "x", then 20 identical "r" interleaved with other calls
    window = [_entry(result="x") for _ in range(5)]
    for i in range(20):
        window += [_entry(), _entry("write", f"b{i}")]
    # Then the streak is 20: interleaving does not break it, the old outcome does
    assert _judge(window) == ("critical", "generic_repeat", 20)


@pytest.mark.parametrize(("copies", "level"), [(29, "none"), (30, "critical"), (31, "critical")])
def test_global_breaker_applies_when_the_own_detector_is_off(copies: int, level: str) -> None:
    config = resolve_loop_config({"enabled": True, "detectors": {"genericRepeat": False}}, None)
    got = _judge([_entry() for _ in range(copies)], config=config)
    assert got[0] == level
    if level == "critical":
        assert got[1:] == ("global_circuit_breaker", copies)


def test_global_breaker_beats_known_poll_with_its_detector_off() -> None:
    config = resolve_loop_config({"enabled": True, "detectors": {"knownPollNoProgress": False}}, None)
    window = [_entry("command_status") for _ in range(30)]
    assert _judge(window, "command_status", config=config) == ("critical", "global_circuit_breaker", 30)


@pytest.mark.parametrize(
    ("copies", "expected"),
    [
        (9, ("none", None, 0)),
        (10, ("warning", "known_poll_no_progress", 10)),
        (11, ("warning", "known_poll_no_progress", 11)),
        (19, ("warning", "known_poll_no_progress", 19)),
        (20, ("critical", "known_poll_no_progress", 20)),
        (21, ("critical", "known_poll_no_progress", 21)),
    ],
)
def test_known_poll_no_progress(copies: int, expected: tuple[str, str | None, int]) -> None:
    assert _judge([_entry("command_status") for _ in range(copies)], "command_status") == expected


def test_known_poll_never_gets_generic_repeat() -> None:
    window = [_entry("command_status", result=f"r{i}") for i in range(25)]
    assert _judge(window, "command_status") == ("none", None, 0)


@pytest.mark.parametrize(
    ("tool", "args", "poll"),
    [
        ("command_status", {}, True),
        ("process", {"action": "poll"}, True),
        ("process", {"action": "log"}, True),
        ("process", {"action": "kill"}, False),
        ("process", "poll", False),
        ("read", {}, False),
    ],
)
def test_known_poll_classification(tool: str, args: Any, poll: bool) -> None:
    assert is_known_poll(tool, args, ("command_status", "process")) is poll


def _alternating(n: int, *, vary: bool = False, a_result: str | None = "ra") -> list[HistoryEntry]:
    return [
        _entry("search", "q", f"{a_result}{i if vary else ''}" if a_result else None)
        if i % 2 == 0
        else _entry("get", "id", "rb")
        for i in range(n)
    ]


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (8, ("none", None, 0)),
        (9, ("warning", "ping_pong", 10)),
        (10, ("warning", "ping_pong", 11)),
        (18, ("warning", "ping_pong", 19)),
        (19, ("critical", "ping_pong", 20)),
        (20, ("critical", "ping_pong", 21)),
    ],
)
def test_ping_pong_with_no_progress(tail: int, expected: tuple[str, str | None, int]) -> None:
    window = _alternating(tail)
    nxt = ("get", "id") if tail % 2 == 1 else ("search", "q")
    assert _judge(window, *nxt) == expected


@pytest.mark.parametrize("a_result", [None, "vary"])
def test_ping_pong_without_evidence_stays_a_warning(a_result: str) -> None:
    window = _alternating(25, vary=a_result == "vary", a_result="ra" if a_result else None)
    assert _judge(window, "get", "id") == ("warning", "ping_pong", 26)


def test_ping_pong_needs_the_current_call_to_continue_the_alternation() -> None:
    window = _alternating(15)
    assert _judge(window, "search", "q")[1] != "ping_pong"


def test_known_poll_warning_wins_over_ping_pong_critical() -> None:
    window = [_entry("command_status") if i % 2 == 0 else _entry("read", "x") for i in range(39)]
    # 20 command_status polls with one outcome: known-poll is critical first.
    assert _judge(window, "command_status")[1] == "known_poll_no_progress"


@pytest.mark.parametrize(("streak", "level"), [(9, "none"), (10, "critical"), (11, "critical")])
def test_unknown_tool_streak(streak: int, level: str) -> None:
    window = [_entry("fetch", f"a{i}", f"e{i}", unknown="fetch") for i in range(streak)]
    got = _judge(window, "fetch", "new")
    assert got[0] == level
    if level == "critical":
        assert got[1:] == ("unknown_tool_repeat", streak)


@pytest.mark.parametrize(
    "breaker",
    [_entry("other"), _entry("fetch", "ok"), _entry("fetch", "z", "e", unknown="another")],
    ids=["other-tool", "success", "different-unknown-name"],
)
def test_unknown_tool_streak_is_broken(breaker: HistoryEntry) -> None:
    window = [_entry("fetch", f"a{i}", "e", unknown="fetch") for i in range(9)] + [breaker]
    window += [_entry("fetch", f"b{i}", "e", unknown="fetch") for i in range(9)]
    assert _judge(window, "fetch", "c")[0] == "none"


def test_unknown_tool_ignores_detector_toggles() -> None:
    config = resolve_loop_config(
        {"enabled": True, "detectors": {"genericRepeat": False, "pingPong": False}}, None
    )
    window = [_entry("fetch", f"a{i}", "e", unknown="fetch") for i in range(10)]
    assert _judge(window, "fetch", "z", config=config)[1] == "unknown_tool_repeat"


def test_disabled_detection_never_judges() -> None:
    config = resolve_loop_config({}, None)
    assert _judge([_entry() for _ in range(40)], config=config) == ("none", None, 0)


def test_disabled_toggles() -> None:
    config = resolve_loop_config(
        {
            "enabled": True,
            "detectors": {"genericRepeat": False, "pingPong": False, "knownPollNoProgress": False},
        },
        None,
    )
    assert _judge([_entry() for _ in range(25)], config=config)[0] == "none"
    assert _judge(_alternating(25), "get", "id", config=config)[0] == "none"
    assert _judge([_entry("command_status") for _ in range(25)], "command_status", config=config)[0] == "none"


def test_run_scope_only_counts_the_same_run() -> None:
    window = [_entry(run="r1") for _ in range(10)] + [_entry(run=None) for _ in range(9)]
    assert _judge(window, run="r1")[0] == "warning"
    assert _judge(window, run=None)[0] == "none"
    assert _judge(window, run="r2")[0] == "none"


@pytest.mark.parametrize(("repeats", "level"), [(3, "none"), (4, "critical"), (5, "critical")])
def test_run_circuit_breaker_counts_repeats_across_tools(repeats: int, level: str) -> None:
    config = resolve_loop_config({"enabled": True, "runCircuitBreakerThreshold": 4}, None)
    tools = ["a", "b", "c"]
    window = [_entry(tools[i % 3]) for i in range(3 + repeats)]
    verdict = evaluate(window, tool="d", args={}, args_hash="d:x", run_id=None, config=config)
    assert verdict.level.value == level
    if level == "critical":
        assert (verdict.detector, verdict.count, verdict.abort_run) == (
            Detector.RUN_CIRCUIT_BREAKER,
            repeats,
            True,
        )


def test_messages_carry_the_asserted_substrings() -> None:
    warn = evaluate(
        [_entry() for _ in range(10)], tool="read", args={}, args_hash="read:a", run_id=None, config=ON
    )
    crit = evaluate(
        [_entry() for _ in range(20)], tool="read", args={}, args_hash="read:a", run_id=None, config=ON
    )
    assert warn.message.startswith("WARNING:")
    assert "10 times" in warn.message
    assert crit.message.startswith("CRITICAL:")
    assert "identical outcomes" in crit.message


@pytest.mark.parametrize(("count", "bucket"), [(9, 0), (10, 1), (19, 1), (20, 2), (3, 0)])
def test_warning_bucket(count: int, bucket: int) -> None:
    assert warning_bucket(count) == bucket
