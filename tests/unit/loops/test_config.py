"""Config: defaults, per-field fallback, merge, auto-raise and ordering validation (spec §2)."""

from __future__ import annotations

from typing import Any

import pytest

from workers.core.loops import LoopDetectionConfig, merge_loop_blocks, parse_loop_block, resolve_loop_config
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
    ("block", "where", "reason"),
    [
        (
            {"warningThreshold": 5, "criticalThreshold": 5},
            "criticalThreshold",
            "warningThreshold must be lower",
        ),
        (
            {"warningThreshold": 6, "criticalThreshold": 5},
            "criticalThreshold",
            "warningThreshold must be lower",
        ),
        (
            {"criticalThreshold": 30, "globalCircuitBreakerThreshold": 30},
            "globalCircuitBreakerThreshold",
            "criticalThreshold must be lower",
        ),
    ],
)
def test_block_ordering_its_own_thresholds_wrongly_is_rejected(
    block: dict[str, Any], where: str, reason: str
) -> None:
    # Global block
    with pytest.raises(ConfigError) as caught:
        resolve_loop_config(block, None)
    assert caught.value.problems[0][0] == f"tools.loopDetection.{where}"
    assert reason in caught.value.problems[0][1]
    # Agent block
    with pytest.raises(ConfigError) as caught:
        resolve_loop_config({}, block)
    assert caught.value.problems[0][0] == f"agents.list[].tools.loopDetection.{where}"


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
    paths = {path for path, _ in caught.value.problems}
    assert "tools.loopDetection.historySise" in paths
    assert "tools.loopDetection.detectors.genericRepeat" in paths


def test_strict_schema_rejects_non_positive_and_misordered() -> None:
    with pytest.raises(ConfigError):
        parse_loop_block({"historySize": 0})
    with pytest.raises(ConfigError, match="warningThreshold must be lower than criticalThreshold"):
        parse_loop_block({"warningThreshold": 9, "criticalThreshold": 9})
    block = parse_loop_block({"warningThreshold": 3, "detectors": {"pingPong": False}})
    assert block.warning_threshold == 3
