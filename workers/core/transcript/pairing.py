"""Call/result pairing repair, frames algorithm.

Every assistant turn with calls opens a frame that runs to the next such turn. Results inside a
frame claim its calls per occurrence (FIFO per id); the rest are attributed backwards only when
exactly one unresolved call can own them. Output puts each turn's results right after it, in call
order, followed by whatever else the frame held.

Where calls share an id, a result carrying a call's name goes to that call, else to the earliest
free one (names and order decide). A result with no id follows one of two rules (``idless``):

- ``legacy`` (OpenClaw's own, for its transcripts): an old session's id-less result is adopted
  by the single call of its frame unless the names conflict, with ``isError`` forced true (the
  model is told it cannot trust whose it is); anywhere else it is an orphan.
- ``by_name`` (the Gemini adapter's, whose id-less responses are the provider's normal form,
  not damage): adoption keeps the result's kind, waits while an earlier call of that name is
  unanswered (no result, or only a placeholder), and a result is moved elsewhere only when
  exactly one unanswered call so far has its name (counting only the calls that came without
  an id, if any of them waits: a call sent with an id expects its id back).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from workers.core.transcript.model import (
    CALL_BLOCK_TYPES,
    DEFAULT_MISSING_TEXT,
    IMPLICIT_ID,
    Message,
    ResultLookup,
    call_blocks,
    is_failed_turn,
    is_synthetic,
    make_synthetic_result,
    result_id,
    result_id_key,
)
from workers.core.transcript.report import PairingReport

__all__ = ["ErroredTurns", "IdlessResults", "PairingResult", "repair_pairing"]

ErroredTurns = Literal["preserve", "drop"]
IdlessResults = Literal["legacy", "by_name"]

# How much a held result is worth: a real result with its id beats an id-less one adopted by
# guess, which beats a synthetic stand-in; only a better result may replace a held one.
_NONE, _SYNTHETIC, _ADOPTED, _REAL = range(4)


@dataclass(frozen=True)
class PairingResult:
    """The repaired messages (the input list itself when nothing changed) and what was done."""

    messages: list[Message]
    report: PairingReport


class _Occurrence:
    """One call of a turn and the result it holds so far."""

    __slots__ = ("call_id", "clean", "idless", "key", "name", "position", "rank", "result", "source")

    def __init__(self, call_id: str, name: str | None, position: int, *, idless: bool = False) -> None:
        self.call_id = call_id
        self.idless = idless  # the provider sent the call without an id (its id was made up)
        # Result ids are read trimmed, so call ids are matched trimmed too.
        self.key = call_id.strip()
        self.name = name
        self.clean = _clean_name(name)
        self.position = position
        self.result: Message | None = None
        self.source: int | None = None
        self.rank = _NONE


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
    allow_synthetic: bool = True,
    idless: IdlessResults = "legacy",
) -> PairingResult:
    """Give every call of every non-failed turn exactly one result, right after its turn.

    Args:
        messages: the neutral transcript; it is never mutated.
        errored_turns: ``preserve`` keeps failed turns and their real results; ``drop`` removes both.
        missing_text: the text of synthetic results.
        lookup: consulted for a call without a result before a synthetic one is invented.
        allow_synthetic: False inserts no synthetic result: a call with no result (none found
            by ``lookup`` either) is removed from its turn, and listed in the report's
            ``unanswered``, so that no provider sees a call without its answer.
        idless: how a result without an id finds its call (the module's docstring).
    """
    tally = _Tally()
    prefix, frames = _split_frames(messages, tally)
    # by_name: names of earlier calls still unanswered (or placeholders); legacy: no such wait
    open_names: set[str | None] | None = set() if idless == "by_name" else None
    for frame in frames:
        _claim_locally(frame, tally, open_names)
        if open_names is not None:
            open_names.update(o.clean for o in frame.occurrences if o.rank < _ADOPTED)
    _recover_across_frames(frames, tally, by_name=open_names is not None)
    output: list[Message] = list(prefix)
    filler = _Filler(lookup, missing_text, allow_synthetic)
    dropped_turns = 0
    for frame in frames:
        if frame.failed and errored_turns == "drop":
            dropped_turns += 1
            for occurrence in frame.occurrences:
                tally.discard(occurrence.source, occurrence.result)
            output.extend(frame.remainder)
            continue
        _emit_frame(frame, filler, output)
    changed = len(output) != len(messages) or any(a is not b for a, b in zip(output, messages, strict=True))
    report = PairingReport(
        added=tuple(filler.added),
        dropped_duplicate_count=tally.duplicates,
        dropped_orphan_count=tally.orphans,
        moved=changed,
        discarded=tuple(message for _, message in sorted(tally.discarded, key=lambda pair: pair[0])),
        dropped_errored_turns=dropped_turns,
        filled_from_lookup=tuple(filler.looked_up),
        unanswered=tuple(filler.unanswered),
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
            made_up = _made_up_ids(message)
            occurrences = [
                _Occurrence(call_id, name, i, idless=call_id in made_up)
                for i, (call_id, name) in enumerate(calls)
            ]
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


def _claim_locally(frame: _Frame, tally: _Tally, open_names: set[str | None] | None) -> None:
    pending, frame.set_aside = frame.set_aside, []
    if not pending:
        return
    by_key: dict[str, list[_Occurrence]] = {}
    for occurrence in frame.occurrences:
        by_key.setdefault(occurrence.key, []).append(occurrence)
    for index, message in pending:
        call_id = result_id(message)
        result = message if call_id is not None else _adopt_legacy_id(frame, message, open_names)
        if result is not message:
            call_id = result_id(result)
        same_id = by_key.get(call_id) if call_id is not None else None
        name = _clean_name(result.get("toolName"))
        owners = same_id if name is None or not same_id else [o for o in same_id if o.clean == name]
        if not owners:  # no call here with the result's id and name: the id may be another turn's
            frame.set_aside.append((index, result))
            continue
        rank = _ADOPTED if result is not message and open_names is not None else _rank(result)
        free = next((o for o in owners if o.result is None), None)
        if free is not None:
            _attach(free, index, result, rank)
        else:
            _resolve_duplicate(owners, index, result, rank, tally)


def _adopt_legacy_id(frame: _Frame, message: Message, open_names: set[str | None] | None) -> Message:
    if len(frame.occurrences) != 1:
        return message
    occurrence = frame.occurrences[0]
    result_name = _clean_name(message.get("toolName"))
    call_name = occurrence.clean
    if result_name and call_name and result_name != call_name:
        return message
    if open_names is None:  # OpenClaw's legacy id fill: whose it is was guessed, so it is an error
        return {**message, "toolCallId": occurrence.call_id, "isError": True}
    if (result_name or call_name) in open_names:
        return message  # an earlier call of that name is unanswered too: whose it is is unclear
    # Adopted with its own kind: a success the tool reported stays a success.
    return {**message, "toolCallId": occurrence.call_id}


def _resolve_duplicate(
    owners: list[_Occurrence], index: int, result: Message, rank: int, tally: _Tally
) -> None:
    tally.duplicates += 1
    holder = next((o for o in owners if o.rank < rank), None)
    if holder is None:
        tally.discard(index, result)
        return
    tally.discard(holder.source, holder.result)
    _attach(holder, index, result, rank)


def _recover_across_frames(frames: list[_Frame], tally: _Tally, *, by_name: bool) -> None:
    unresolved: dict[str, list[_Occurrence]] = {}
    unresolved_by_name: dict[str | None, list[_Occurrence]] = {}
    for frame in frames:
        for occurrence in frame.occurrences:
            if occurrence.rank < _REAL:
                unresolved.setdefault(occurrence.key, []).append(occurrence)
                unresolved_by_name.setdefault(occurrence.clean, []).append(occurrence)
        for index, result in frame.set_aside:
            if result_id(result) is None and not by_name:
                tally.orphans += 1  # OpenClaw's rule: an id-less result its frame did not adopt
                tally.discard(index, result)
            elif result_id(result) is None:
                _recover_by_name(unresolved_by_name, index, result, tally)
            else:
                _recover_one(unresolved, index, result, tally)
        frame.set_aside = []


def _recover_by_name(
    unresolved: dict[str | None, list[_Occurrence]], index: int, result: Message, tally: _Tally
) -> None:
    name = _clean_name(result.get("toolName"))
    candidates = [o for o in unresolved.get(name, []) if o.rank < _ADOPTED] if name else []
    # A call sent with an id expects it back, so an id-less result is an id-less call's if any waits.
    candidates = [o for o in candidates if o.idless] or candidates
    if len(candidates) != 1:
        tally.orphans += 1
        tally.discard(index, result)
        return
    owner = candidates[0]
    if owner.result is not None:
        tally.duplicates += 1
        tally.discard(owner.source, owner.result)
    _attach(owner, index, {**result, "toolCallId": owner.call_id}, _ADOPTED)


def _recover_one(
    unresolved: dict[str, list[_Occurrence]], index: int, result: Message, tally: _Tally
) -> None:
    call_id = result_id(result)
    rank = _rank(result)
    owners = unresolved.get(call_id, []) if call_id is not None else []
    candidates = [o for o in owners if o.rank < rank]
    name = _clean_name(result.get("toolName"))
    named = [o for o in candidates if name is not None and o.clean == name]
    candidates = named or candidates
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


def _made_up_ids(message: Message) -> set[Any]:
    """The ids an adapter made up for the message's calls that the provider sent without one."""
    content = message.get("content")
    blocks = content if isinstance(content, list) else []
    return {b.get("id") for b in blocks if isinstance(b, dict) and b.get(IMPLICIT_ID)}


def _rank(result: Message) -> int:
    return _SYNTHETIC if is_synthetic(result) else _REAL


def _attach(occurrence: _Occurrence, index: int | None, result: Message, rank: int) -> None:
    key = "toolCallId" if result.get("toolCallId") == occurrence.call_id else result_id_key(result)
    if key is not None and result[key] != occurrence.call_id:
        result = {**result, key: occurrence.call_id}  # the call's exact id, for the id rewrite
    occurrence.result = _normalize_name(result, occurrence.name)
    occurrence.source = index
    occurrence.rank = rank


class _Filler:
    """Answers for calls left without a result: the lookup's, else a synthetic, else none."""

    def __init__(self, lookup: ResultLookup | None, missing_text: str, allow_synthetic: bool) -> None:
        self.lookup = lookup
        self.missing_text = missing_text
        self.allow_synthetic = allow_synthetic
        self.added: list[Message] = []
        self.looked_up: list[Message] = []
        self.unanswered: list[tuple[str, str | None]] = []

    def fill(self, occurrence: _Occurrence) -> Message | None:
        name = _clean_name(occurrence.name) or "unknown"
        found = self.lookup(occurrence.call_id, name) if self.lookup is not None else None
        if found is not None:
            result = {**found, "role": "toolResult", "toolCallId": occurrence.call_id}
            result = _normalize_name(result, name)
            self.looked_up.append(result)
            return result
        if not self.allow_synthetic:
            self.unanswered.append((occurrence.call_id, occurrence.name))
            return None
        synthetic = make_synthetic_result(occurrence.call_id, occurrence.name, self.missing_text)
        self.added.append(synthetic)
        return synthetic


def _emit_frame(frame: _Frame, filler: _Filler, output: list[Message]) -> None:
    results: list[Message] = []
    unanswered: set[int] = set()
    for occurrence in frame.occurrences:
        result = occurrence.result
        if result is None and not frame.failed:
            result = filler.fill(occurrence)
            if result is None:
                unanswered.add(occurrence.position)
        if result is not None:
            results.append(result)
    assistant = _without_calls(frame.assistant, unanswered) if unanswered else frame.assistant
    if assistant is not None:
        output.append(assistant)
    output.extend(results)
    output.extend(frame.remainder)


def _without_calls(assistant: Message, positions: set[int]) -> Message | None:
    """The turn without the pairable calls at ``positions``; None when nothing is left of it."""
    kept: list[Any] = []
    position = 0
    for block in assistant["content"]:
        if isinstance(block, dict) and block.get("type") in CALL_BLOCK_TYPES and _has_id(block):
            position += 1
            if position - 1 in positions:
                continue
        kept.append(block)
    return {**assistant, "content": kept} if kept else None


def _has_id(block: dict[str, Any]) -> bool:
    return isinstance(block.get("id"), str) and bool(block["id"])


def _clean_name(name: object) -> str | None:
    if isinstance(name, str):
        return name.strip() or None
    return None


def _normalize_name(result: Message, call_name: str | None) -> Message:
    name = result.get("toolName")
    if not isinstance(name, str) or (name and not name[0].isspace() and not name[-1].isspace()):
        return result
    wanted = _clean_name(name) or _clean_name(call_name) or "unknown"
    return result if wanted == name else {**result, "toolName": wanted}
