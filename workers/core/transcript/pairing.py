"""Call/result pairing repair, frames algorithm (spec transcript-repair §2.3.1).

Every assistant turn with calls opens a frame that runs to the next such turn. Results inside a
frame claim its calls per occurrence (FIFO per id); the rest are attributed backwards only when
exactly one unresolved call can own them. Output puts each turn's results right after it, in call
order, followed by whatever else the frame held.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from workers.core.transcript.model import (
    DEFAULT_MISSING_TEXT,
    Message,
    ResultLookup,
    call_blocks,
    is_failed_turn,
    is_synthetic,
    make_synthetic_result,
    result_id,
)
from workers.core.transcript.report import PairingReport

__all__ = ["ErroredTurns", "PairingResult", "repair_pairing"]

ErroredTurns = Literal["preserve", "drop"]

# How much a held result is worth: a real result with its id beats an id-less one adopted by
# guess, which beats a synthetic stand-in; only a better result may replace a held one.
_NONE, _SYNTHETIC, _ADOPTED, _REAL = range(4)


@dataclass(frozen=True)
class PairingResult:
    """The repaired messages (the input list itself when nothing changed) and what was done."""

    messages: list[Message]
    report: PairingReport


@dataclass
class _Occurrence:
    call_id: str
    name: str | None
    result: Message | None = None
    source: int | None = None
    rank: int = _NONE


@dataclass
class _Frame:
    assistant: Message
    occurrences: list[_Occurrence]
    failed: bool
    remainder: list[Message] = field(default_factory=list)
    set_aside: list[tuple[int, Message]] = field(default_factory=list)


@dataclass
class _Tally:
    duplicates: int = 0
    orphans: int = 0
    discarded: list[tuple[int, Message]] = field(default_factory=list)

    def discard(self, index: int | None, message: Message | None) -> None:
        if index is not None and message is not None:
            self.discarded.append((index, message))


def repair_pairing(
    messages: list[Any],
    *,
    errored_turns: ErroredTurns = "preserve",
    missing_text: str = DEFAULT_MISSING_TEXT,
    lookup: ResultLookup | None = None,
) -> PairingResult:
    """Give every call of every non-failed turn exactly one result, right after its turn.

    Args:
        messages: the neutral transcript; it is never mutated.
        errored_turns: ``preserve`` keeps failed turns and their real results; ``drop`` removes both.
        missing_text: the text of synthetic results.
        lookup: consulted for a call without a result before a synthetic one is invented.
    """
    tally = _Tally()
    prefix, frames = _split_frames(messages, tally)
    for frame in frames:
        _claim_locally(frame, tally)
    _recover_across_frames(frames, tally)
    output: list[Message] = list(prefix)
    added: list[Message] = []
    looked_up: list[Message] = []
    dropped_turns = 0
    for frame in frames:
        if frame.failed and errored_turns == "drop":
            dropped_turns += 1
            for occurrence in frame.occurrences:
                tally.discard(occurrence.source, occurrence.result)
            output.extend(frame.remainder)
            continue
        output.append(frame.assistant)
        for occurrence in frame.occurrences:
            result = occurrence.result
            if result is None and not frame.failed:
                result = _fill_missing(occurrence, lookup, missing_text, added, looked_up)
            if result is not None:
                output.append(result)
        output.extend(frame.remainder)
    changed = len(output) != len(messages) or any(a is not b for a, b in zip(output, messages, strict=True))
    report = PairingReport(
        added=tuple(added),
        dropped_duplicate_count=tally.duplicates,
        dropped_orphan_count=tally.orphans,
        moved=changed,
        discarded=tuple(message for _, message in sorted(tally.discarded, key=lambda pair: pair[0])),
        dropped_errored_turns=dropped_turns,
        filled_from_lookup=tuple(looked_up),
    )
    return PairingResult(output if changed else messages, report)


def _split_frames(messages: list[Any], tally: _Tally) -> tuple[list[Message], list[_Frame]]:
    prefix: list[Message] = []
    frames: list[_Frame] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        calls = call_blocks(message)
        if calls:
            occurrences = [_Occurrence(call_id, name) for call_id, name in calls]
            frames.append(_Frame(message, occurrences, is_failed_turn(message)))
        elif message.get("role") == "toolResult":
            if frames:
                frames[-1].set_aside.append((index, message))
            else:
                tally.orphans += 1
                tally.discard(index, message)
        elif frames:
            frames[-1].remainder.append(message)
        else:
            prefix.append(message)
    return prefix, frames


def _claim_locally(frame: _Frame, tally: _Tally) -> None:
    pending, frame.set_aside = frame.set_aside, []
    frame_ids = {occurrence.call_id for occurrence in frame.occurrences}
    for index, message in pending:
        result = _adopt_legacy_id(frame, message)
        call_id = result_id(result)
        if call_id is None or call_id not in frame_ids:
            frame.set_aside.append((index, result))
            continue
        rank = _ADOPTED if result is not message else _rank(result)
        free = next((o for o in frame.occurrences if o.call_id == call_id and o.result is None), None)
        if free is not None:
            _attach(free, index, result, rank)
        else:
            _resolve_duplicate(frame, index, result, rank, tally)


def _adopt_legacy_id(frame: _Frame, message: Message) -> Message:
    if result_id(message) is not None or len(frame.occurrences) != 1:
        return message
    occurrence = frame.occurrences[0]
    result_name = _clean_name(message.get("toolName"))
    call_name = _clean_name(occurrence.name)
    if result_name and call_name and result_name != call_name:
        return message
    # An id-less result could be anyone's; forcing isError tells the model it is not trustworthy.
    return {**message, "toolCallId": occurrence.call_id, "isError": True}


def _resolve_duplicate(frame: _Frame, index: int, result: Message, rank: int, tally: _Tally) -> None:
    tally.duplicates += 1
    call_id = result_id(result)
    holder = next((o for o in frame.occurrences if o.call_id == call_id and o.rank < rank), None)
    if holder is None:
        tally.discard(index, result)
        return
    tally.discard(holder.source, holder.result)
    _attach(holder, index, result, rank)


def _recover_across_frames(frames: list[_Frame], tally: _Tally) -> None:
    unresolved: dict[str, list[_Occurrence]] = {}
    for frame in frames:
        for occurrence in frame.occurrences:
            if occurrence.rank < _REAL:
                unresolved.setdefault(occurrence.call_id, []).append(occurrence)
        for index, result in frame.set_aside:
            _recover_one(unresolved, index, result, tally)
        frame.set_aside = []


def _recover_one(
    unresolved: dict[str, list[_Occurrence]], index: int, result: Message, tally: _Tally
) -> None:
    call_id = result_id(result)
    rank = _rank(result)
    owners = unresolved.get(call_id, []) if call_id is not None else []
    candidates = [o for o in owners if o.rank < rank]
    if len(candidates) != 1:
        tally.orphans += 1
        tally.discard(index, result)
        return
    owner = candidates[0]
    if owner.result is not None:
        tally.duplicates += 1
        tally.discard(owner.source, owner.result)
    _attach(owner, index, result, rank)
    if rank == _REAL:
        owners.remove(owner)


def _rank(result: Message) -> int:
    return _SYNTHETIC if is_synthetic(result) else _REAL


def _attach(occurrence: _Occurrence, index: int | None, result: Message, rank: int) -> None:
    occurrence.result = _normalize_name(result, occurrence.name)
    occurrence.source = index
    occurrence.rank = rank


def _fill_missing(
    occurrence: _Occurrence,
    lookup: ResultLookup | None,
    missing_text: str,
    added: list[Message],
    looked_up: list[Message],
) -> Message:
    name = _clean_name(occurrence.name) or "unknown"
    found = lookup(occurrence.call_id, name) if lookup is not None else None
    if found is not None:
        result = _normalize_name({**found, "role": "toolResult", "toolCallId": occurrence.call_id}, name)
        looked_up.append(result)
        return result
    synthetic = make_synthetic_result(occurrence.call_id, occurrence.name, missing_text)
    added.append(synthetic)
    return synthetic


def _clean_name(name: object) -> str | None:
    if isinstance(name, str) and name.strip():
        return name.strip()
    return None


def _normalize_name(result: Message, call_name: str | None) -> Message:
    name = result.get("toolName")
    if not isinstance(name, str):
        return result
    wanted = _clean_name(name) or _clean_name(call_name) or "unknown"
    return result if wanted == name else {**result, "toolName": wanted}
