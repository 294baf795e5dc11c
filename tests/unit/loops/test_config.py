"""Config: defaults, per-field fallback, merge, auto-raise of misordered thresholds."""

from __future__ import annotations

from typing import Any

import pytest

from workers.core.loops import LoopDetectionConfig, merge_loop_blocks, parse_loop_block, resolve_loop_config
from workers.core.loops.config import raised_thresholds
from workers.errors import ConfigError


def test_defaults_without_any_block() -> None:
    # Given / When
    config = resolve_loop_config(None, None)
    # Then
    assert config == LoopDetectionConfig()
    assert (config.enabled, config.guard_enabled) == (False, True)
    assert (config.history_size, config.warning_threshold, config.critical_threshold) == (30, 10, 20)
    assert (config.global_circuit_breaker_threshold, config.unknown_tool_threshold) == (30, 10)
    assert config.guard_window_size == 3
    assert config.run_circuit_breaker_threshold is None
    assert config.known_poll_tools == ("command_status", "process")


@pytest.mark.parametrize(
    ("block", "thresholds"),
    [
        ({"warningThreshold": 25}, (25, 26, 30)),
        ({"warningThreshold": 40}, (40, 41, 42)),
        ({"criticalThreshold": 30}, (10, 30, 31)),
        ({"globalCircuitBreakerThreshold": 5}, (10, 20, 21)),
        ({"warningThreshold": 19}, (19, 20, 30)),
        ({"warningThreshold": 20}, (20, 21, 30)),
        ({"warningThreshold": 21}, (21, 22, 30)),
    ],
)
def test_auto_raise(block: dict[str, Any], thresholds: tuple[int, int, int]) -> None:
    config = resolve_loop_config(block, None)
    got = (config.warning_threshold, config.critical_threshold, config.global_circuit_breaker_threshold)
    assert got == thresholds


@pytest.mark.parametrize(
    ("global_block", "agent_block", "thresholds"),
    [
        ({"warningThreshold": 3}, {"criticalThreshold": 2}, (3, 4, 30)),
        ({"warningThreshold": 2, "criticalThreshold": 4}, {"globalCircuitBreakerThreshold": 3}, (2, 4, 5)),
    ],
)
def test_merged_values_are_auto_raised_not_rejected(
    global_block: dict[str, Any], agent_block: dict[str, Any], thresholds: tuple[int, int, int]
) -> None:
    config = resolve_loop_config(global_block, agent_block)
    got = (config.warning_threshold, config.critical_threshold, config.global_circuit_breaker_threshold)
    assert got == thresholds


@pytest.mark.parametrize("bad", [0, -1, 2.5, "12", None, True, [5]])
@pytest.mark.parametrize(
    ("key", "attribute", "default"),
    [
        ("historySize", "history_size", 30),
        ("warningThreshold", "warning_threshold", 10),
        ("criticalThreshold", "critical_threshold", 20),
        ("globalCircuitBreakerThreshold", "global_circuit_breaker_threshold", 30),
        ("unknownToolThreshold", "unknown_tool_threshold", 10),
    ],
)
def test_positive_integer_fallback_per_field(bad: Any, key: str, attribute: str, default: int) -> None:
    # Given a bad value in one field and a good value in another
    block = {key: bad, "historySize" if key != "historySize" else "unknownToolThreshold": 7}
    # When
    config = resolve_loop_config(block, None)
    # Then only the bad field falls back
    assert getattr(config, attribute) == default
    assert 7 in (config.history_size, config.unknown_tool_threshold)


def test_integral_float_counts_as_an_integer() -> None:
    assert resolve_loop_config({"historySize": 12.0}, None).history_size == 12


@pytest.mark.parametrize(("value", "size"), [(None, 3), (0, 3), (1, 1), (5, 5)])
def test_guard_window_size(value: Any, size: int) -> None:
    assert resolve_loop_config({"postCompactionGuard": {"windowSize": value}}, None).guard_window_size == size


@pytest.mark.parametrize(
    ("enabled", "detection", "guard"),
    [(None, False, True), (True, True, True), (False, False, False), ("yes", False, True)],
)
def test_enabled_switches_detection_and_guard(enabled: Any, detection: bool, guard: bool) -> None:
    block = {} if enabled is None else {"enabled": enabled}
    config = resolve_loop_config(block, None)
    assert (config.enabled, config.guard_enabled) == (detection, guard)


def test_agent_block_overrides_field_by_field() -> None:
    config = resolve_loop_config({"enabled": True, "historySize": 50}, {"historySize": 40})
    assert (config.enabled, config.history_size) == (True, 40)


def test_agent_block_alone_and_global_block_alone() -> None:
    assert resolve_loop_config(None, {"warningThreshold": 4}).warning_threshold == 4
    assert resolve_loop_config({"warningThreshold": 5}, None).warning_threshold == 5


def test_detectors_merge_per_key() -> None:
    # Given a global block that disables two detectors and an agent that re-enables one
    global_block = {"detectors": {"genericRepeat": False, "pingPong": False}}
    agent_block = {"detectors": {"genericRepeat": True}}
    # When
    config = resolve_loop_config(global_block, agent_block)
    # Then the sibling toggle is kept
    assert (config.generic_repeat, config.ping_pong, config.known_poll_no_progress) == (True, False, True)


def test_post_compaction_guard_merges_per_key_and_snake_case_is_accepted() -> None:
    merged = merge_loop_blocks({"postCompactionGuard": {"windowSize": 5}}, {"post_compaction_guard": {}})
    assert merged["postCompactionGuard"] == {"windowSize": 5}
    assert resolve_loop_config({"warning_threshold": 4}, None).warning_threshold == 4


def test_beyond_reference_fields() -> None:
    config = resolve_loop_config({"runCircuitBreakerThreshold": 12, "knownPollTools": ["Job_Status"]}, None)
    assert config.run_circuit_breaker_threshold == 12
    assert config.known_poll_tools == ("job_status",)
    assert resolve_loop_config({"knownPollTools": "x"}, None).known_poll_tools == (
        "command_status",
        "process",
    )


@pytest.mark.parametrize(
    ("block", "where", "raised"),
    [
        ({"warningThreshold": 5, "criticalThreshold": 5}, "criticalThreshold", (5, 6, 30)),
        ({"warningThreshold": 6, "criticalThreshold": 5}, "criticalThreshold", (6, 7, 30)),
        (
            {"criticalThreshold": 30, "globalCircuitBreakerThreshold": 30},
            "globalCircuitBreakerThreshold",
            (10, 30, 31),
        ),
    ],
)
def test_block_ordering_its_own_thresholds_wrongly_is_raised_as_the_reference_does(
    block: dict[str, Any], where: str, raised: tuple[int, int, int]
) -> None:
    # Global block and agent block alike: accepted, and resolved in order
    for config in (resolve_loop_config(block, None), resolve_loop_config({}, block)):
        triple = (
            config.warning_threshold,
            config.critical_threshold,
            config.global_circuit_breaker_threshold,
        )
        assert triple == raised
    # And the raise is named, for the start-up warning and config check
    assert [path for path, _ in raised_thresholds(block, "tools.loopDetection")] == [
        f"tools.loopDetection.{where}"
    ]
    assert parse_loop_block(block) is not None


def test_raise_of_a_default_threshold_is_named_too() -> None:
    # warningThreshold 25 lifts the default critical (20) to 26, and the breaker (30) stays
    found = dict(raised_thresholds({"warningThreshold": 25}, "p"))
    assert found == {
        "p.criticalThreshold": "the default 20 is not above warningThreshold; raised to 26 (as OpenClaw does)"
    }


def test_thresholds_in_order_raise_nothing() -> None:
    assert raised_thresholds({"warningThreshold": 4, "criticalThreshold": 5}, "p") == []


def test_ordering_within_a_block_just_right_is_accepted() -> None:
    config = resolve_loop_config(
        {"warningThreshold": 4, "criticalThreshold": 5, "globalCircuitBreakerThreshold": 6}, None
    )
    assert (config.warning_threshold, config.critical_threshold, config.global_circuit_breaker_threshold) == (
        4,
        5,
        6,
    )


def test_strict_schema_names_every_bad_key_path() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_loop_block({"enabled": True, "historySise": 5, "detectors": {"genericRepeat": "no"}})
    problems = dict(caught.value.problems)
    assert problems["tools.loopDetection.historySise"] == "unknown key; did you mean 'historySize'?"
    assert "tools.loopDetection.detectors.genericRepeat" in problems


@pytest.mark.parametrize(
    ("block", "path", "meant"),
    [
        ({"detectors": {"pingpong": True}}, "tools.loopDetection.detectors.pingpong", "pingPong"),
        (
            {"postCompactionGuard": {"window_sise": 3}},
            "tools.loopDetection.postCompactionGuard.window_sise",
            "window_size",
        ),
        ({"warning_treshold": 3}, "tools.loopDetection.warning_treshold", "warning_threshold"),
    ],
)
def test_unknown_keys_at_any_depth_say_did_you_mean(block: dict[str, Any], path: str, meant: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_loop_block(block)
    assert dict(caught.value.problems)[path] == f"unknown key; did you mean {meant!r}?"


def test_strict_schema_rejects_non_positive() -> None:
    with pytest.raises(ConfigError):
        parse_loop_block({"historySize": 0})
    block = parse_loop_block({"warningThreshold": 3, "detectors": {"pingPong": False}})
    assert block.warning_threshold == 3
