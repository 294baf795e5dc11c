"""Loop-detection configuration: schema, global + per-agent merge, fallback, auto-raise.

Two layers, as in OpenClaw:

* :class:`LoopDetectionBlock` is the strict schema of one ``tools.loopDetection`` block
  (global or ``agents.list[].tools.loopDetection``). Use :func:`parse_loop_block` when
  loading settings: unknown keys (with "did you mean") and non-positive numbers raise
  :class:`~workers.errors.ConfigError` naming the key path.
* :func:`resolve_loop_config` is the runtime resolver: every bad numeric value falls back
  to its default per field, unknown keys are ignored, and the thresholds are repaired by the
  auto-raise, as OpenClaw does: ``criticalThreshold`` and then
  ``globalCircuitBreakerThreshold`` are raised above the threshold they must exceed.
  :func:`raised_thresholds` names each such raise, for the start-up warning and
  ``config check``.

Keys are accepted in camelCase (as in OpenClaw) or snake_case.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError
from pydantic.alias_generators import to_camel, to_snake

from workers.core.did_you_mean import unknown_key_message
from workers.errors import ConfigError

__all__ = [
    "DEFAULT_KNOWN_POLL_TOOLS",
    "GLOBAL_PATH",
    "DetectorToggles",
    "LoopDetectionBlock",
    "LoopDetectionConfig",
    "agent_path",
    "merge_loop_blocks",
    "parse_loop_block",
    "raised_thresholds",
    "resolve_loop_config",
]

GLOBAL_PATH: Final = "tools.loopDetection"
DEFAULT_KNOWN_POLL_TOOLS: Final = ("command_status", "process")

_NESTED: Final = ("detectors", "postCompactionGuard")


def agent_path(index: int | None = None) -> str:
    """The key path of an agent's block (``agents.list[<i>].tools.loopDetection``)."""
    return f"agents.list[{'' if index is None else index}].tools.loopDetection"


class _Camel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, strict=True
    )


class DetectorToggles(_Camel):
    """``detectors``: which rolling detectors may warn and block."""

    generic_repeat: bool | None = None
    known_poll_no_progress: bool | None = None
    ping_pong: bool | None = None


class PostCompactionGuardBlock(_Camel):
    """``postCompactionGuard``: how many post-compaction outcomes the guard watches."""

    window_size: PositiveInt | None = None


class LoopDetectionBlock(_Camel):
    """The strict schema of one ``tools.loopDetection`` block; every field optional."""

    enabled: bool | None = None
    history_size: PositiveInt | None = None
    warning_threshold: PositiveInt | None = None
    critical_threshold: PositiveInt | None = None
    global_circuit_breaker_threshold: PositiveInt | None = None
    unknown_tool_threshold: PositiveInt | None = None
    run_circuit_breaker_threshold: PositiveInt | None = None
    known_poll_tools: list[str] | None = None
    detectors: DetectorToggles | None = None
    post_compaction_guard: PostCompactionGuardBlock | None = None


class LoopDetectionConfig(BaseModel):
    """The resolved runtime values, after merge, defaults, fallback and auto-raise."""

    model_config = ConfigDict(frozen=True)

    enabled: bool = False
    guard_enabled: bool = True
    history_size: int = 30
    warning_threshold: int = 10
    critical_threshold: int = 20
    global_circuit_breaker_threshold: int = 30
    unknown_tool_threshold: int = 10
    run_circuit_breaker_threshold: int | None = None
    known_poll_tools: tuple[str, ...] = DEFAULT_KNOWN_POLL_TOOLS
    generic_repeat: bool = True
    known_poll_no_progress: bool = True
    ping_pong: bool = True
    guard_window_size: int = 3
    send_tools: frozenset[str] = Field(default_factory=frozenset)


def parse_loop_block(raw: Mapping[str, Any], path: str = GLOBAL_PATH) -> LoopDetectionBlock:
    """Validate one block strictly.

    A misordered threshold triple is not an error: it is raised at resolution (see
    :func:`raised_thresholds`).

    Raises:
        ConfigError: naming the key path of every unknown key (with "did you mean") or bad value.
    """
    try:
        return LoopDetectionBlock.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = ".".join(str(part) for part in error["loc"])
            message = error["msg"]
            if error["type"] == "extra_forbidden":
                message = unknown_key_message(LoopDetectionBlock, error["loc"])
            problems.append((f"{path}.{loc}" if loc else path, message))
        raise ConfigError(problems) from None


def resolve_loop_config(
    global_block: Mapping[str, Any] | None,
    agent_block: Mapping[str, Any] | None,
    *,
    global_block_path: str = GLOBAL_PATH,
    agent_block_path: str = agent_path(),
) -> LoopDetectionConfig:
    """Merge the global and agent blocks and resolve the runtime values.

    Never raises: a misordered threshold triple is raised into order, as in OpenClaw
    (``global_block_path`` and ``agent_block_path`` are kept for callers' messages).
    """
    del global_block_path, agent_block_path
    return _resolve(merge_loop_blocks(global_block, agent_block))


def raised_thresholds(merged: Mapping[str, Any], path: str) -> list[tuple[str, str]]:
    """Each threshold of a merged block that resolution raises, as (key path, what and why).

    OpenClaw raises ``criticalThreshold`` above ``warningThreshold`` and then
    ``globalCircuitBreakerThreshold`` above ``criticalThreshold`` when set at or below them.
    """
    block = _canonical(merged)
    resolved = _resolve(block)
    found = []
    for lower, upper, default, value in (
        ("warningThreshold", "criticalThreshold", 20, resolved.critical_threshold),
        ("criticalThreshold", "globalCircuitBreakerThreshold", 30, resolved.global_circuit_breaker_threshold),
    ):
        written = _positive_int(block.get(upper))
        before = f"{written}" if written is not None else f"the default {default}"
        if (default if written is None else written) != value:
            found.append(
                (
                    f"{path}.{upper}",
                    f"{before} is not above {lower}; raised to {value} (as OpenClaw does)",
                )
            )
    return found


def merge_loop_blocks(
    global_block: Mapping[str, Any] | None, agent_block: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Field-by-field merge: agent keys override; ``detectors`` and ``postCompactionGuard`` per key."""
    if agent_block is None:
        return _canonical(global_block or {})
    if global_block is None:
        return _canonical(agent_block)
    base, override = _canonical(global_block), _canonical(agent_block)
    merged = {**base, **override}
    for key in _NESTED:
        low, high = base.get(key), override.get(key)
        if isinstance(low, Mapping) and isinstance(high, Mapping):
            merged[key] = {**low, **high}
    return merged


def _canonical(block: Mapping[str, Any]) -> dict[str, Any]:
    """Rename snake_case keys to camelCase so both spellings merge as one key."""
    out: dict[str, Any] = {}
    for key, value in block.items():
        name = to_camel(to_snake(str(key)))
        out[name] = _canonical(value) if name in _NESTED and isinstance(value, Mapping) else value
    return out


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value > 0 else None


def _int_or(value: Any, default: int) -> int:
    coerced = _positive_int(value)
    return default if coerced is None else coerced


def _toggle(block: Any, key: str) -> bool:
    value = block.get(key) if isinstance(block, Mapping) else None
    return value is not False


def _known_poll_tools(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) and item for item in value):
        return DEFAULT_KNOWN_POLL_TOOLS
    return tuple(item.strip().lower() for item in value)


def _resolve(block: Mapping[str, Any]) -> LoopDetectionConfig:
    warning = _int_or(block.get("warningThreshold"), 10)
    critical = _int_or(block.get("criticalThreshold"), 20)
    breaker = _int_or(block.get("globalCircuitBreakerThreshold"), 30)
    # The warning threshold is never changed; critical, then the breaker, are raised above it.
    critical = max(critical, warning + 1)
    breaker = max(breaker, critical + 1)
    detectors = block.get("detectors")
    guard = block.get("postCompactionGuard")
    return LoopDetectionConfig(
        enabled=block.get("enabled") is True,
        guard_enabled=block.get("enabled") is not False,
        history_size=_int_or(block.get("historySize"), 30),
        warning_threshold=warning,
        critical_threshold=critical,
        global_circuit_breaker_threshold=breaker,
        unknown_tool_threshold=_int_or(block.get("unknownToolThreshold"), 10),
        run_circuit_breaker_threshold=_positive_int(block.get("runCircuitBreakerThreshold")),
        known_poll_tools=_known_poll_tools(block.get("knownPollTools")),
        generic_repeat=_toggle(detectors, "genericRepeat"),
        known_poll_no_progress=_toggle(detectors, "knownPollNoProgress"),
        ping_pong=_toggle(detectors, "pingPong"),
        guard_window_size=_int_or(guard.get("windowSize") if isinstance(guard, Mapping) else None, 3),
    )
