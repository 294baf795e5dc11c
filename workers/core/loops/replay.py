"""Replay a recorded call sequence through the real loop check.

The input is an object with ``config`` (or ``globalConfig`` + ``agentConfig``) and
``calls``; unknown keys are ignored. Each call item is a tool call
``{tool, args, result, isError?, runId?}`` or a ``{"event": "compaction"}`` marker. The
output is aligned 1:1 with ``calls``. A marker without a ``runId`` arms the guard of the
run of the nearest call (the previous one, else the next one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from workers.core.loops.config import LoopDetectionConfig, resolve_loop_config
from workers.core.loops.detectors import Level, LoopVerdict
from workers.core.loops.hashing import UNDEFINED
from workers.core.loops.history import LoopHistory, RunScope
from workers.core.loops.session import LoopGuard
from workers.errors import ConfigError

__all__ = ["compare_expectations", "replay", "verdict_to_json"]


def replay(
    spec_obj: Any, history_factory: Callable[[], LoopHistory], *, session_key: str = "replay"
) -> list[dict[str, Any]]:
    """Run every call item through a fresh history; returns one verdict object per item.

    Raises:
        ConfigError: naming the JSON path of malformed input (misordered thresholds are raised).
    """
    if not isinstance(spec_obj, Mapping):
        raise ConfigError([("$", "expected an object with 'config' and 'calls'")])
    calls = spec_obj.get("calls")
    if not isinstance(calls, list):
        raise ConfigError([("$.calls", "expected an array of calls")])
    for index, item in enumerate(calls):
        _check_item(item, f"$.calls[{index}]")
    guard = LoopGuard(history_factory(), _config(spec_obj))
    out: list[dict[str, Any]] = []
    for index, item in enumerate(calls):
        now_ms = index + 1
        scope = RunScope(session_key, _run_for(calls, index))
        if item.get("event") == "compaction":
            out.append({"event": "compaction", "guardEnabled": guard.note_compaction(scope, now_ms)})
            continue
        pending = guard.before_call(scope, item["tool"], item.get("args", UNDEFINED), now_ms, f"call-{index}")
        verdict = pending.verdict
        if not verdict.blocked:
            result = item.get("result", UNDEFINED)
            is_error = item.get("isError") is True
            verdict = guard.after_call(pending, result, is_error=is_error, now_ms=now_ms) or verdict
        out.append(verdict_to_json(verdict))
    return out


def verdict_to_json(verdict: LoopVerdict) -> dict[str, Any]:
    """The replay form of a verdict: ``{level, detector?, count?, blocked, warningEmitted?, abortRun?}``."""
    out: dict[str, Any] = {"level": verdict.level.value}
    if verdict.level is not Level.NONE and verdict.detector is not None:
        out["detector"] = verdict.detector.value
        out["count"] = verdict.count
    out["blocked"] = verdict.blocked
    if verdict.level is Level.WARNING:
        out["warningEmitted"] = bool(verdict.warning_emitted)
    if verdict.abort_run:
        out["abortRun"] = True
    return out


def compare_expectations(actual: Sequence[Mapping[str, Any]], expect: Any) -> list[str]:
    """Differences from an ``expect`` array; fields absent from an expectation are not checked."""
    if not isinstance(expect, list):
        return ["$.expect: expected an array"]
    problems = []
    if len(expect) != len(actual):
        problems.append(f"$.expect: {len(expect)} expectations for {len(actual)} calls")
    for index, (got, want) in enumerate(zip(actual, expect, strict=False)):
        if not isinstance(want, Mapping):
            problems.append(f"$.expect[{index}]: expected an object")
            continue
        for key, value in want.items():
            if got.get(key) != value:
                problems.append(f"calls[{index}].{key}: expected {value!r}, got {got.get(key)!r}")
    return problems


def _config(spec_obj: Mapping[str, Any]) -> LoopDetectionConfig:
    if "config" in spec_obj:
        global_path, global_block, agent_block = "$.config", spec_obj["config"], None
    else:
        global_path, global_block = "$.globalConfig", spec_obj.get("globalConfig")
        agent_block = spec_obj.get("agentConfig")
    for path, block in ((global_path, global_block), ("$.agentConfig", agent_block)):
        if block is not None and not isinstance(block, Mapping):
            raise ConfigError([(path, "expected an object")])
    return resolve_loop_config(
        global_block, agent_block, global_block_path=global_path, agent_block_path="$.agentConfig"
    )


def _check_item(item: Any, path: str) -> None:
    if not isinstance(item, Mapping):
        raise ConfigError([(path, "expected an object")])
    if "event" in item:
        if item["event"] != "compaction":
            raise ConfigError([(f"{path}.event", "only 'compaction' is supported")])
        return
    if not isinstance(item.get("tool"), str):
        raise ConfigError([(f"{path}.tool", "expected a string")])
    if "isError" in item and not isinstance(item["isError"], bool):
        raise ConfigError([(f"{path}.isError", "expected a boolean")])
    if "runId" in item and item["runId"] is not None and not isinstance(item["runId"], str):
        raise ConfigError([(f"{path}.runId", "expected a string")])


def _run_id(item: Mapping[str, Any]) -> str:
    run_id = item.get("runId")
    # A run id is trimmed; blank means unscoped.
    return run_id.strip() if isinstance(run_id, str) else ""


def _run_for(calls: Sequence[Mapping[str, Any]], index: int) -> str:
    item = calls[index]
    if "event" not in item or "runId" in item:
        return _run_id(item)
    for other in [*reversed(calls[:index]), *calls[index + 1 :]]:
        if "event" not in other:
            return _run_id(other)
    return ""
