"""The rolling-history loop detectors and warning de-duplication buckets.

:func:`judge` is pure: it judges one call from the :class:`WindowSignals` of the earlier
records of the same run and returns a :class:`LoopVerdict`; :func:`evaluate` does the same
from the window itself. The first matching rule wins, in this order: unknown-tool streak,
global circuit breaker, run-wide breaker (beyond OpenClaw, opt-in), known-poll
no-progress, ping-pong, generic repeat.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from workers.core.loops.config import LoopDetectionConfig
from workers.core.loops.history import HistoryEntry
from workers.core.loops.signals import WindowSignals, signals_of

__all__ = [
    "WARNING_BUCKET_SIZE",
    "Detector",
    "Level",
    "LoopVerdict",
    "evaluate",
    "is_known_poll",
    "judge",
    "warning_bucket",
]

# Warnings are let out once per bucket of ten; fixed, independent of warningThreshold.
WARNING_BUCKET_SIZE = 10


class Level(enum.StrEnum):
    """How stuck a call looks."""

    NONE = "none"
    WARNING = "warning"
    CRITICAL = "critical"


class Detector(enum.StrEnum):
    """Which rule produced a verdict."""

    GENERIC_REPEAT = "generic_repeat"
    KNOWN_POLL_NO_PROGRESS = "known_poll_no_progress"
    PING_PONG = "ping_pong"
    UNKNOWN_TOOL_REPEAT = "unknown_tool_repeat"
    GLOBAL_CIRCUIT_BREAKER = "global_circuit_breaker"
    RUN_CIRCUIT_BREAKER = "run_circuit_breaker"
    COMPACTION_LOOP_PERSISTED = "compaction_loop_persisted"


@dataclass(frozen=True)
class LoopVerdict:
    """The verdict on one call: critical blocks it; ``abort_run`` ends the whole run."""

    level: Level = Level.NONE
    detector: Detector | None = None
    count: int = 0
    message: str = ""
    blocked: bool = False
    warning_key: str | None = None
    warning_emitted: bool | None = None
    abort_run: bool = False
    paired_tool_name: str | None = None


_NOT_STUCK = LoopVerdict()


def warning_bucket(count: int) -> int:
    """The de-duplication bucket of a warning count."""
    return count // WARNING_BUCKET_SIZE


def is_known_poll(tool: str, args: Any, known_poll_tools: Sequence[str]) -> bool:
    """True for a polling call: a listed tool, where ``process`` only counts for poll/log actions."""
    if tool not in known_poll_tools:
        return False
    if tool != "process":
        return True
    return isinstance(args, Mapping) and args.get("action") in ("poll", "log")


def evaluate(
    window: Sequence[HistoryEntry],
    *,
    tool: str,
    args: Any,
    args_hash: str,
    run_id: str | None,
    config: LoopDetectionConfig,
) -> LoopVerdict:
    """Judge one call against the earlier records of its run (detectors in evaluation order)."""
    if not config.enabled:
        return _NOT_STUCK
    signals = signals_of(
        window, tool=tool, args_hash=args_hash, run_id=run_id, evidence_at=config.critical_threshold
    )
    return judge(signals, tool=tool, args=args, args_hash=args_hash, config=config)


def judge(
    signals: WindowSignals, *, tool: str, args: Any, args_hash: str, config: LoopDetectionConfig
) -> LoopVerdict:
    """Judge one call from the signals of its window (computed with ``evidence_at`` = critical)."""
    if not config.enabled:
        return _NOT_STUCK
    verdict = _breakers(signals, tool, args_hash, config)
    if verdict is not None:
        return verdict
    if is_known_poll(tool, args, config.known_poll_tools):
        poll = _known_poll(signals, tool, args_hash, config)
        return poll or _ping_pong(signals, tool, args_hash, config) or _NOT_STUCK
    return (
        _ping_pong(signals, tool, args_hash, config)
        or _generic(signals, tool, args_hash, config)
        or _NOT_STUCK
    )


def _breakers(
    signals: WindowSignals, tool: str, args_hash: str, config: LoopDetectionConfig
) -> LoopVerdict | None:
    streak, name = signals.unknown_streak, signals.unknown_name
    if streak >= config.unknown_tool_threshold:
        message = (
            f"CRITICAL: attempted unavailable tool `{name}` {streak} times. This tool does not exist "
            "here; stop retrying it and answer without it."
        )
        return _critical(Detector.UNKNOWN_TOOL_REPEAT, streak, message, f"unknown-tool:{tool}:{name}")
    stalled, latest = signals.stalled, signals.latest
    if stalled >= config.global_circuit_breaker_threshold:
        message = (
            f"CRITICAL: {tool} has repeated identical no-progress outcomes {stalled} times. "
            "Session execution blocked by global circuit breaker to prevent runaway loops."
        )
        return _critical(
            Detector.GLOBAL_CIRCUIT_BREAKER, stalled, message, f"global:{tool}:{args_hash}:{latest or 'none'}"
        )
    threshold = config.run_circuit_breaker_threshold
    if threshold is not None:
        repeats = signals.run_repeats
        if repeats >= threshold:
            message = (
                f"CRITICAL: this run produced {repeats} no-progress outcomes across its tools. "
                "The run is stopped by the run-wide circuit breaker; report failure to the user."
            )
            verdict = _critical(Detector.RUN_CIRCUIT_BREAKER, repeats, message, "run-breaker")
            return replace(verdict, abort_run=True)
    return None


def _known_poll(
    signals: WindowSignals, tool: str, args_hash: str, config: LoopDetectionConfig
) -> LoopVerdict | None:
    if not config.known_poll_no_progress:
        return None
    stalled, latest = signals.stalled, signals.latest
    key = f"poll:{tool}:{args_hash}:{latest or 'none'}"
    if stalled >= config.critical_threshold:
        message = (
            f"CRITICAL: {tool} is stuck in a polling loop: {stalled} identical calls with no progress. "
            "Session execution blocked; stop polling and report the failure."
        )
        return _critical(Detector.KNOWN_POLL_NO_PROGRESS, stalled, message, key)
    if stalled >= config.warning_threshold:
        message = (
            f"WARNING: {tool} was called {stalled} times with identical arguments and no progress. "
            "Increase the wait between checks, or stop and report the failure."
        )
        return _warning(Detector.KNOWN_POLL_NO_PROGRESS, stalled, message, key)
    return None


def _ping_pong(
    signals: WindowSignals, tool: str, args_hash: str, config: LoopDetectionConfig
) -> LoopVerdict | None:
    if not config.ping_pong:
        return None
    count, pair = signals.alternation, signals.pair
    paired_tool, evidence = signals.paired_tool, signals.evidence
    if count == 0:
        return None
    key = "pingpong:" + "|".join(sorted(pair)) if pair else f"pingpong:{tool}:{args_hash}"
    described = f"alternating between repeated tool-call patterns ({count} consecutive calls)"
    if count >= config.critical_threshold and evidence:
        message = (
            f"CRITICAL: You are {described} with no progress. This ping-pong loop is blocked; "
            "stop and report the failure."
        )
        verdict = _critical(Detector.PING_PONG, count, message, key)
        return replace(verdict, paired_tool_name=paired_tool)
    if count >= config.warning_threshold:
        message = (
            f"WARNING: You are {described}. This looks like a ping-pong loop; "
            "stop retrying and report the failure if there is no progress."
        )
        verdict = _warning(Detector.PING_PONG, count, message, key)
        return replace(verdict, paired_tool_name=paired_tool)
    return None


def _generic(
    signals: WindowSignals, tool: str, args_hash: str, config: LoopDetectionConfig
) -> LoopVerdict | None:
    if not config.generic_repeat:
        return None
    stalled, latest = signals.stalled, signals.latest
    if stalled >= config.critical_threshold:
        message = (
            f"CRITICAL: {tool} was called with identical arguments and identical outcomes {stalled} "
            "times. Execution is blocked; stop and report the failure."
        )
        return _critical(Detector.GENERIC_REPEAT, stalled, message, f"generic:{tool}:{args_hash}:{latest}")
    recent = signals.recent
    if recent >= config.warning_threshold:
        message = (
            f"WARNING: You have called {tool} {recent} times with identical arguments. "
            "If this is not making progress, stop retrying and report the failure."
        )
        return _warning(Detector.GENERIC_REPEAT, recent, message, f"generic:{tool}:{args_hash}")
    return None


def _critical(detector: Detector, count: int, message: str, key: str) -> LoopVerdict:
    return LoopVerdict(Level.CRITICAL, detector, count, message, blocked=True, warning_key=key)


def _warning(detector: Detector, count: int, message: str, key: str) -> LoopVerdict:
    return LoopVerdict(Level.WARNING, detector, count, message, warning_key=key)
