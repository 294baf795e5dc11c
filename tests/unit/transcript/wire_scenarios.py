"""Hypothesis-generated damaged transcripts in each wire format, with the truth about every result.

A scenario is a list of provider-neutral events (user text, assistant turns with calls, results)
plus what the generator knows and repair must not contradict: which call each real result belongs
to. Every call carries ``{"serial": k}`` as its arguments and every real result the text
``out-<k>-<n>``, so the owner of a result can be read off any repaired wire transcript whatever its
ids became. Orphans say ``orphan-<n>``; OpenClaw's synthetic placeholders carry its default text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

from hypothesis import strategies as st

FORMATS: Final = ("anthropic", "openai-chat", "openai-responses", "gemini")
OPENCLAW_TEXT: Final = (
    "[openclaw] missing tool result in session history;"
    " inserted synthetic error result for transcript repair."
)
NAMES: Final = ("read", "exec", "ls", "grep", "write_file")
ILLEGAL_IDS: Final = (
    "call|{k}",
    "functions.write_file:{k}",
    "functions write_file:{k}",
    " call {k}",
    "a.b/{k}",
)
FATES: Final = ("ok",) * 6 + ("missing", "duplicate", "displaced", "late", "placeholder", "shuffled")
# Fewer clean answers and more placeholders that a real result follows only after the next turn
POSITIONAL_FATES: Final = ("ok",) * 3 + FATES[6:] + ("flushed",) * 2


@dataclass(frozen=True)
class Call:
    serial: int
    call_id: str | None
    name: str
    item_id: str | None = None
    status: str | None = None


@dataclass(frozen=True)
class Result:
    owner: int | None  # serial of the call it belongs to; None for an orphan
    call_id: str | None
    name: str
    text: str
    is_error: bool = False


@dataclass(frozen=True)
class Turn:
    text: str | None
    calls: tuple[Call, ...]


@dataclass(frozen=True)
class User:
    text: str


Event = Turn | Result | User


@dataclass
class Scenario:
    fmt: str
    events: list[Event] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    names: tuple[str, ...] = NAMES
    positional: bool = False

    def wire(self) -> list[dict[str, Any]]:
        return _RENDER[self.fmt](self.events)


@st.composite
def scenarios(
    draw: st.DrawFn,
    fmt: str,
    *,
    names: tuple[str, ...] = NAMES,
    ids: bool | None = None,
    positional: bool = False,
) -> Scenario:
    """One damaged transcript in ``fmt``: gaps, duplicates, orphans, displaced and late results.

    ``names`` are the tool names calls draw from (few names, many calls of one name); ``ids``
    False leaves Gemini ids out everywhere (None draws it); with Gemini ids on, about one call
    in four still comes without one, as in a transcript that spans models. ``positional`` adds
    the shapes that test attribution by position: id-less orphans with real tools' names, in the
    turn after the calls or displaced, and placeholders whose real result comes only after the
    next turn.
    """
    scenario = Scenario(fmt, names=names, positional=positional)
    with_ids = fmt != "gemini" or (draw(st.booleans()) if ids is None else ids)
    late: list[Result] = []
    stale: list[Result] = []  # real results of flushed placeholders, displaced in the next frame
    if draw(st.booleans()):
        scenario.events.append(User(draw(_texts)))
    for _ in range(draw(st.integers(1, 5))):
        turn_calls = [_call(draw, scenario, with_ids) for _ in range(draw(st.integers(0, 3)))]
        scenario.events.append(Turn(draw(st.one_of(st.none(), _texts)), tuple(turn_calls)))
        scenario.events.extend(late)
        late = []
        displaced, stale = stale, []
        now, displaced_now = _results(draw, scenario, turn_calls, late, stale)
        displaced += displaced_now
        scenario.events.extend(now)
        if draw(st.integers(0, 5)) == 0:
            orphan = _orphan(draw, scenario, with_ids)
            displace = positional and draw(st.booleans())
            (displaced if displace else scenario.events).append(orphan)
        if len(displaced) > 0 or draw(st.booleans()):
            scenario.events.append(User(draw(_texts)))
        scenario.events.extend(displaced)
    if draw(st.integers(0, 3)) == 0:  # an aborted turn: calls that never got results
        calls = [_call(draw, scenario, with_ids, aborted=True) for _ in range(draw(st.integers(1, 2)))]
        scenario.events.append(Turn(None, tuple(calls)))
    return scenario


_texts = st.sampled_from(["go on", "", "  ", "look at this"])


def _call(draw: st.DrawFn, scenario: Scenario, with_ids: bool, *, aborted: bool = False) -> Call:
    k = len(scenario.calls)
    name = draw(st.sampled_from(scenario.names))
    idless = not with_ids or (scenario.fmt == "gemini" and draw(st.integers(0, 3)) == 0)
    call_id = None if idless else _call_id(draw, scenario, k)
    item_id = status = None
    if scenario.fmt == "openai-responses":
        kind = draw(st.sampled_from(["none", "own", "own", "repeat"]))
        earlier = [c.item_id for c in scenario.calls if c.item_id]
        item_id = draw(st.sampled_from(earlier)) if kind == "repeat" and earlier else f"fc_{k}"
        item_id = None if kind == "none" else item_id
        status = draw(st.sampled_from(["incomplete", "in_progress"])) if aborted else None
    call = Call(k, call_id, name, item_id, status)
    scenario.calls.append(call)
    return call


def _call_id(draw: st.DrawFn, scenario: Scenario, k: int) -> str:
    kind = draw(st.sampled_from(["plain", "plain", "toolu", "illegal", "long", "repeat"]))
    earlier = [c.call_id for c in scenario.calls if c.call_id]
    if kind == "repeat" and earlier:
        return draw(st.sampled_from(earlier))
    if kind == "toolu":
        return f"toolu_{k}"
    if kind == "illegal":
        return draw(st.sampled_from(ILLEGAL_IDS)).format(k=k)
    if kind == "long":
        return f"call_{k}_" + "x" * draw(st.integers(40, 90))
    return f"call_{k}"


def _results(
    draw: st.DrawFn, scenario: Scenario, calls: list[Call], late: list[Result], stale: list[Result]
) -> tuple[list[Result], list[Result]]:
    now: list[Result] = []
    displaced: list[Result] = []
    shuffle = False
    for call in calls:
        real = Result(call.serial, call.call_id, call.name, f"out-{call.serial}-0", draw(st.booleans()))
        fate = draw(st.sampled_from(POSITIONAL_FATES if scenario.positional else FATES))
        shuffle = shuffle or fate == "shuffled"
        if fate in ("ok", "shuffled"):
            now.append(real)
        elif fate == "duplicate":
            now += [real, Result(call.serial, call.call_id, call.name, f"out-{call.serial}-1")]
        elif fate == "displaced":
            displaced.append(real)
        elif fate == "late":
            late.append(real)
        elif fate in ("placeholder", "flushed"):
            now.append(Result(call.serial, call.call_id, call.name, OPENCLAW_TEXT, True))
            (displaced if fate == "placeholder" else stale).append(real)
    if shuffle:
        now = draw(st.permutations(now))
    return now, displaced


def _orphan(draw: st.DrawFn, scenario: Scenario, with_ids: bool) -> Result:
    n = sum(1 for e in scenario.events if isinstance(e, Result) and e.owner is None)
    call_id = f"ghost_{n}" if with_ids else None
    named = with_ids or scenario.positional
    names = (*scenario.names, "ghost") if scenario.positional else scenario.names
    return Result(None, call_id, draw(st.sampled_from(names)) if named else "ghost", f"orphan-{n}")


def _args(call: Call) -> dict[str, int]:
    return {"serial": call.serial}


def _runs(events: list[Event]) -> list[Event | list[Result]]:
    """Events with each run of consecutive results gathered into one list."""
    grouped: list[Event | list[Result]] = []
    for event in events:
        if isinstance(event, Result) and grouped and isinstance(grouped[-1], list):
            grouped[-1].append(event)
        else:
            grouped.append([event] if isinstance(event, Result) else event)
    return grouped


def _anthropic(events: list[Event]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for event in _runs(events):
        if isinstance(event, list):
            blocks: list[dict[str, Any]] = [
                {
                    "type": "tool_result",
                    "tool_use_id": r.call_id,
                    "content": [{"type": "text", "text": r.text}],
                }
                | {"is_error": r.is_error}
                for r in event
            ]
            out.append({"role": "user", "content": blocks})
        elif isinstance(event, User):
            out.append({"role": "user", "content": event.text})
        elif isinstance(event, Turn):
            blocks = [{"type": "text", "text": event.text}] if event.text is not None else []
            blocks += [
                {"type": "tool_use", "id": c.call_id, "name": c.name, "input": _args(c)} for c in event.calls
            ]
            out.append({"role": "assistant", "content": blocks or [{"type": "text", "text": ""}]})
    return out


def _chat(events: list[Event]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for event in events:
        if isinstance(event, Result):
            out.append({"role": "tool", "tool_call_id": event.call_id, "content": event.text})
        elif isinstance(event, User):
            out.append({"role": "user", "content": event.text})
        else:
            message: dict[str, Any] = {"role": "assistant", "content": event.text}
            if event.calls:
                message["tool_calls"] = [
                    {
                        "id": c.call_id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(_args(c))},
                    }
                    for c in event.calls
                ]
            elif event.text is None:
                message["content"] = ""
            out.append(message)
    return out


def _responses(events: list[Event]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for event in events:
        if isinstance(event, Result):
            out.append({"type": "function_call_output", "call_id": event.call_id, "output": event.text})
        elif isinstance(event, User):
            out.append({"role": "user", "content": event.text})
        else:
            if event.text is not None or not event.calls:
                out.append({"role": "assistant", "content": event.text or ""})
            for c in event.calls:
                item = {"type": "function_call", "call_id": c.call_id, "name": c.name}
                item["arguments"] = json.dumps(_args(c))
                item |= {"id": c.item_id} if c.item_id else {}
                out.append(item | ({"status": c.status} if c.status else {}))
    return out


def _gemini(events: list[Event]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for event in _runs(events):
        if isinstance(event, list):
            parts: list[dict[str, Any]] = []
            for r in event:
                response = {"name": r.name, "response": {"error" if r.is_error else "output": r.text}}
                parts.append({"functionResponse": response | ({"id": r.call_id} if r.call_id else {})})
            out.append({"role": "user", "parts": parts})
        elif isinstance(event, User):
            out.append({"role": "user", "parts": [{"text": event.text}]})
        elif isinstance(event, Turn):
            parts = [{"text": event.text}] if event.text is not None else []
            for c in event.calls:
                call = {"name": c.name, "args": _args(c)} | ({"id": c.call_id} if c.call_id else {})
                parts.append({"functionCall": call})
            out.append({"role": "model", "parts": parts or [{"text": ""}]})
    return out


_RENDER: Final = {
    "anthropic": _anthropic,
    "openai-chat": _chat,
    "openai-responses": _responses,
    "gemini": _gemini,
}
