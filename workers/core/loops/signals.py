"""What the detectors need to know about a call's window, as a handful of numbers.

The rules (:mod:`workers.core.loops.detectors`) judge a call from a :class:`WindowSignals`,
never from the window itself, so a store can keep these figures up to date as records come
and go (the Redis store does, in its loop scripts) and a check reads O(1) state instead of
parsing the whole window. :func:`signals_of` computes them from a window: it is the
reference every store must agree with (the in-memory store uses it; a property test holds
the Redis scripts to it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["WindowSignals", "signals_of"]


class HistoryEntry(Protocol):
    """What the signals read of a record (``workers.core.loops.history.HistoryEntry`` has it)."""

    @property
    def tool_name(self) -> str: ...
    @property
    def args_hash(self) -> str: ...
    @property
    def run_id(self) -> str | None: ...
    @property
    def result_hash(self) -> str | None: ...
    @property
    def unknown_tool_name(self) -> str | None: ...


@dataclass(frozen=True)
class WindowSignals:
    """The window, as seen by one call (``tool`` with ``args_hash``).

    * ``unknown_streak``/``unknown_name``: newest records in a row that called ``tool`` and
      were answered "unknown tool" with the same name;
    * ``stalled``/``latest``: newest outcomes of this exact call (tool + args) in a row with
      the same result hash, and that hash (other calls in between are skipped);
    * ``recent``: records of this exact call, answered or not;
    * ``run_repeats``: outcomes repeating an earlier identical (tool, args, result) of the run;
    * ``alternation``: ping-pong count with this call included (0: not alternating into it),
      ``pair`` the two args hashes, ``paired_tool`` the newest record's tool, ``evidence``
      whether every alternating record has one fixed outcome per side (only computed, and
      only true, when ``alternation`` reaches ``evidence_at``).
    """

    unknown_streak: int = 0
    unknown_name: str | None = None
    stalled: int = 0
    latest: str | None = None
    recent: int = 0
    run_repeats: int = 0
    alternation: int = 0
    pair: tuple[str, ...] = ()
    paired_tool: str | None = None
    evidence: bool = False


def signals_of(
    window: Sequence[HistoryEntry], *, tool: str, args_hash: str, run_id: str | None, evidence_at: int
) -> WindowSignals:
    """The signals of a call against the records of its run in ``window`` (oldest first)."""
    history = [entry for entry in window if (entry.run_id or None) == (run_id or None)]
    streak, name = _unknown_streak(history, tool)
    stalled, latest = _no_progress(history, tool, args_hash)
    count, pair, paired_tool, evidence = _alternation(history, args_hash, evidence_at)
    return WindowSignals(
        unknown_streak=streak,
        unknown_name=name,
        stalled=stalled,
        latest=latest,
        recent=sum(1 for entry in history if entry.tool_name == tool and entry.args_hash == args_hash),
        run_repeats=_run_no_progress(history),
        alternation=count,
        pair=pair,
        paired_tool=paired_tool,
        evidence=evidence,
    )


def _unknown_streak(history: list[HistoryEntry], tool: str) -> tuple[int, str | None]:
    count, name = 0, None
    for entry in reversed(history):
        if entry.tool_name != tool or not entry.unknown_tool_name:
            break
        if name is not None and entry.unknown_tool_name != name:
            break
        name = entry.unknown_tool_name
        count += 1
    return count, name


def _no_progress(history: list[HistoryEntry], tool: str, args_hash: str) -> tuple[int, str | None]:
    count, latest = 0, None
    for entry in reversed(history):
        # Other calls interleaved between repeats do not break the streak: they are skipped.
        if entry.tool_name != tool or entry.args_hash != args_hash or entry.result_hash is None:
            continue
        if latest is None:
            latest = entry.result_hash
        elif entry.result_hash != latest:
            break
        count += 1
    return count, latest


def _run_no_progress(history: list[HistoryEntry]) -> int:
    """Outcomes that repeat an earlier identical (tool, args, result) of the run, any tool."""
    seen: set[tuple[str, str, str]] = set()
    repeats = 0
    for entry in history:
        if entry.result_hash is None:
            continue
        triple = (entry.tool_name, entry.args_hash, entry.result_hash)
        if triple in seen:
            repeats += 1
        seen.add(triple)
    return repeats


def _alternation(
    history: list[HistoryEntry], args_hash: str, evidence_at: int
) -> tuple[int, tuple[str, ...], str | None, bool]:
    """Ping-pong count (current call included), the args pair, the paired tool, no-progress evidence."""
    if not history:
        return 0, (), None, False
    last = history[-1]
    other = next((e.args_hash for e in reversed(history[:-1]) if e.args_hash != last.args_hash), None)
    if other is None:
        return 0, (), None, False
    tail: list[HistoryEntry] = []
    for index, entry in enumerate(reversed(history)):
        if entry.args_hash != (last.args_hash if index % 2 == 0 else other):
            break
        tail.append(entry)
    if len(tail) < 2 or args_hash != other:
        return 0, (), None, False
    count = len(tail) + 1
    evidence = False
    if count >= evidence_at:
        sides = [{e.result_hash for e in tail[0::2]}, {e.result_hash for e in tail[1::2]}]
        evidence = all(e.result_hash is not None for e in tail) and all(len(side) == 1 for side in sides)
    return count, (last.args_hash, other), last.tool_name, evidence
