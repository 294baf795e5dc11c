"""What each provider's API accepts: its SDK's types (through pydantic) plus its pairing, id and turn rules.

The rules are the ones the APIs enforce with the errors they return and their docs:
Anthropic answers every ``tool_use`` in the very next message and wants ids matching
``^[a-zA-Z0-9_-]+$`` and non-empty texts; Chat wants tool messages right after their call, ids of
at most 40 characters; Responses wants one output per call, unique ``call_id``s of at most 64
characters and unique ``fc``-prefixed item ids; Gemini wants a function call turn right after a
user turn and the responses, as many as the calls and in their order, in the very next turn.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import pydantic
import typing_extensions
from anthropic.types import MessageParam
from google.genai.types import Content
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseInputItemParam

from tests.unit.transcript.wire_scenarios import OPENCLAW_TEXT, Result, Scenario
from workers.core.transcript import DEFAULT_MISSING_TEXT, repair_transcript, resolve_policy
from workers.core.transcript.adapters import decode, default_model_api, encode, idless_results

_ANTHROPIC_ID: Final = re.compile(r"^[a-zA-Z0-9_-]+$")
_OUT: Final = re.compile(r"^out-(\d+)-\d+$")


def _forbid_unknown_keys() -> None:
    # The SDKs' TypedDicts accept any extra key; the APIs do not.
    for name, module in list(sys.modules.items()):
        if name.startswith(("anthropic.types", "openai.types")):
            for obj in vars(module).values():
                if typing_extensions.is_typeddict(obj) and "__pydantic_config__" not in obj.__dict__:
                    obj.__pydantic_config__ = pydantic.ConfigDict(extra="forbid")


_forbid_unknown_keys()
_SDK: Final[dict[str, Callable[[Any], object]]] = {
    "anthropic": pydantic.TypeAdapter(list[MessageParam]).validate_python,
    "openai-chat": pydantic.TypeAdapter(list[ChatCompletionMessageParam]).validate_python,
    "openai-responses": pydantic.TypeAdapter(list[ResponseInputItemParam]).validate_python,
    "gemini": pydantic.TypeAdapter(list[Content]).validate_python,
}


def repair_wire(fmt: str, wire: list[Any]) -> Any:
    """What ``unstuck repair --format fmt`` does: decode, repair with the format's policy, encode."""
    policy = resolve_policy(None, default_model_api(fmt))
    return encode(
        fmt, repair_transcript(decode(fmt, wire), policy, idless=idless_results(fmt)).messages, wire
    )


def sdk_problems(fmt: str, wire: Any) -> list[str]:
    """Where the SDK's types reject the transcript (iterable fields are walked, not left lazy)."""
    try:
        _force(_SDK[fmt](wire))
    except pydantic.ValidationError as error:
        return [f"sdk: {e['loc']}: {e['msg']}" for e in error.errors()[:3]]
    return []


def _force(value: Any) -> None:
    if isinstance(value, dict):
        for item in value.values():
            _force(item)
    elif isinstance(value, list | tuple) or type(value).__name__ == "ValidatorIterator":
        for item in value:
            _force(item)


@dataclass
class Verdict:
    """What is wrong with one repaired transcript; ``pairs`` is (call serial, result text) per answer."""

    problems: list[str] = field(default_factory=list)
    pairs: list[tuple[int | None, str]] = field(default_factory=list)
    serials: set[int] = field(default_factory=set)


def _serial(arguments: Any) -> int | None:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    return arguments.get("serial") if isinstance(arguments, dict) else None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return str(content.get("output", content.get("error", "")))
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""


def _anthropic(wire: list[dict[str, Any]], verdict: Verdict) -> None:
    seen: Counter[str] = Counter()
    for index, message in enumerate(wire):
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        if not content:
            verdict.problems.append(f"[{index}] empty content")
        for block in blocks:
            if block.get("type") == "text" and not block.get("text", "").strip():
                verdict.problems.append(f"[{index}] empty text block")
        uses = {b["id"]: b for b in blocks if b.get("type") == "tool_use"}
        for block in blocks:
            if block.get("type") == "tool_use":
                seen[block["id"]] += 1
                verdict.serials.add(_serial(block.get("input")) or -1)
                if not _ANTHROPIC_ID.match(block["id"]):
                    verdict.problems.append(f"[{index}] tool_use id {block['id']!r} breaks the pattern")
        nxt = wire[index + 1].get("content") if index + 1 < len(wire) else None
        answers = [b for b in (nxt if isinstance(nxt, list) else []) if b.get("type") == "tool_result"]
        use_ids = [b["id"] for b in blocks if b.get("type") == "tool_use"]
        if uses and Counter(b["tool_use_id"] for b in answers) != Counter(use_ids):
            verdict.problems.append(f"[{index}] tool_use ids without exactly one tool_result right after")
        if uses:
            verdict.pairs += [
                (_serial(uses[b["tool_use_id"]].get("input")), _text(b.get("content")))
                for b in answers
                if b["tool_use_id"] in uses
            ]
        own = [i for i, b in enumerate(blocks) if b.get("type") == "tool_result"]
        prev = wire[index - 1].get("content") if index else None
        prev_ids = {b["id"] for b in (prev if isinstance(prev, list) else []) if b.get("type") == "tool_use"}
        if own and ({blocks[i]["tool_use_id"] for i in own} - prev_ids or own != list(range(len(own)))):
            verdict.problems.append(f"[{index}] tool_result without tool_use just before, or after text")
    if any(count > 1 for count in seen.values()):
        verdict.problems.append("tool_use ids repeat")


def _chat(wire: list[dict[str, Any]], verdict: Verdict) -> None:
    expecting: dict[str, int | None] = {}
    seen: Counter[str] = Counter()
    for index, message in enumerate(wire):
        if message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in expecting:
                verdict.problems.append(f"[{index}] tool message answers no pending tool_call")
            else:
                verdict.pairs.append((expecting.pop(call_id), _text(message.get("content"))))
            continue
        if expecting:
            verdict.problems.append(f"[{index}] tool_calls {sorted(expecting)} got no tool message")
        calls = message.get("tool_calls") or []
        expecting = {c["id"]: _serial(c["function"].get("arguments")) for c in calls}
        for call in calls:
            seen[call["id"]] += 1
            verdict.serials.add(_serial(call["function"].get("arguments")) or -1)
            if not 0 < len(call["id"]) <= 40:
                verdict.problems.append(f"[{index}] tool_call id of {len(call['id'])} chars")
        if message.get("role") == "assistant" and message.get("content") is None and not calls:
            verdict.problems.append(f"[{index}] assistant with neither content nor tool_calls")
    if expecting:
        verdict.problems.append(f"tool_calls {sorted(expecting)} got no tool message")
    if any(count > 1 for count in seen.values()):
        verdict.problems.append("tool_call ids repeat")


def _responses(wire: list[dict[str, Any]], verdict: Verdict) -> None:
    calls: dict[str, int | None] = {}
    answered: Counter[str] = Counter()
    item_ids: Counter[str] = Counter()
    for index, item in enumerate(wire):
        if isinstance(item.get("id"), str):
            item_ids[item["id"]] += 1
        if item.get("type") == "function_call":
            call_id = item["call_id"]
            verdict.serials.add(_serial(item.get("arguments")) or -1)
            if call_id in calls:
                verdict.problems.append(f"[{index}] call_id {call_id!r} repeats")
            if not 0 < len(call_id) <= 64:
                verdict.problems.append(f"[{index}] call_id of {len(call_id)} chars")
            if "id" in item and not str(item["id"]).startswith("fc"):
                verdict.problems.append(f"[{index}] function_call id {item['id']!r} does not start with fc")
            calls[call_id] = _serial(item.get("arguments"))
        elif item.get("type") == "function_call_output":
            call_id = item["call_id"]
            if call_id not in calls:
                verdict.problems.append(f"[{index}] no tool call found for output {call_id!r}")
            else:
                answered[call_id] += 1
                verdict.pairs.append((calls[call_id], _text(item.get("output"))))
    if any(answered[call_id] != 1 for call_id in calls):
        verdict.problems.append("a function_call without exactly one output")
    if any(count > 1 for count in item_ids.values()):
        verdict.problems.append("item ids repeat")


def _gemini(wire: list[dict[str, Any]], verdict: Verdict) -> None:
    for index, content in enumerate(wire):
        parts = content.get("parts") or []
        if not parts:
            verdict.problems.append(f"[{index}] no parts")
        if any("text" in p and not str(p["text"]).strip() for p in parts):
            verdict.problems.append(f"[{index}] empty text part")
        calls = [p["functionCall"] for p in parts if "functionCall" in p]
        responses = [p["functionResponse"] for p in parts if "functionResponse" in p]
        previous = wire[index - 1] if index else None
        if calls and (previous is None or previous.get("role") != "user"):
            verdict.problems.append(f"[{index}] function call turn not right after a user turn")
        if responses:
            before = [p["functionCall"] for p in (previous or {}).get("parts", []) if "functionCall" in p]
            if not before:
                verdict.problems.append(f"[{index}] function response turn not right after a call turn")
        if not calls:
            continue
        verdict.serials.update(_serial(c.get("args")) or -1 for c in calls)
        nxt = wire[index + 1] if index + 1 < len(wire) else {}
        answers = [p["functionResponse"] for p in nxt.get("parts", []) if "functionResponse" in p]
        if len(answers) != len(calls) or nxt.get("role") != "user":
            verdict.problems.append(f"[{index}] {len(calls)} calls but {len(answers)} responses after")
            continue
        for call, answer in zip(calls, answers, strict=True):
            if call["name"] != answer["name"] or ("id" in call and call.get("id") != answer.get("id")):
                verdict.problems.append(f"[{index}] response {answer.get('name')} out of order")
            verdict.pairs.append((_serial(call.get("args")), _text(answer.get("response"))))


_RULES: Final = {
    "anthropic": _anthropic,
    "openai-chat": _chat,
    "openai-responses": _responses,
    "gemini": _gemini,
}


def judge(fmt: str, wire: Any) -> Verdict:
    """The SDK's and the API rules' problems with ``wire``, and the answers it gives its calls."""
    verdict = Verdict(sdk_problems(fmt, wire))
    if not verdict.problems:
        _RULES[fmt](wire, verdict)
    return verdict


def attribution_problems(scenario: Scenario, verdict: Verdict) -> list[str]:
    """Real results attached to another call, and real results lost although their owner is certain.

    Where calls share an id (or, without ids, a name) the wire format itself attributes results by
    order, so only results of calls whose key no other call shares are held to their true owner.
    """
    certain = _certain_calls(scenario)
    problems = []
    for serial, text in verdict.pairs:
        if text.startswith("orphan-"):
            problems.append(f"orphan {text} attached to call {serial}")
        match = _OUT.match(text)
        if match and int(match.group(1)) in certain and int(match.group(1)) != serial:
            problems.append(f"result {text} attached to call {serial}")
    answered = {serial: text for serial, text in verdict.pairs}
    owned = {e.owner for e in scenario.events if isinstance(e, Result) and _OUT.match(e.text)}
    for call in certain & owned:
        if call in verdict.serials and not _OUT.match(answered.get(call, "")):
            problems.append(f"call {call} lost its real result (got {answered.get(call)!r})")
    return problems


def _certain_calls(scenario: Scenario) -> set[int]:
    # Gemini pairs by name and order, so there names tell calls with one id apart.
    by_name = scenario.fmt == "gemini"
    keys = [(c.call_id, c.name if by_name or c.call_id is None else "") for c in scenario.calls]
    counts = Counter(keys)
    return {c.serial for c, key in zip(scenario.calls, keys, strict=True) if counts[key] == 1}


# -- Gemini without ids: what the turn right after the calls says, by position --------------------

_PLACEHOLDERS: Final = frozenset({OPENCLAW_TEXT, DEFAULT_MISSING_TEXT})


@dataclass
class _Group:
    """The calls of one name in one call turn, and the id-less responses of that name right after."""

    name: str
    calls: list[int] = field(default_factory=list)
    responses: list[tuple[str, str]] = field(default_factory=list)  # (output or error, text)


def _call_serial(call: dict[str, Any]) -> int:
    serial = _serial(call.get("args"))
    return -1 if serial is None else serial


def _response(part: dict[str, Any]) -> tuple[str, str, str]:
    response = part["functionResponse"]
    key, text = next(iter(response["response"].items()))
    return response["name"], key, text


def _positions(wire: list[dict[str, Any]]) -> tuple[list[_Group], dict[str, str]]:
    """Each call turn's groups, and the responses no call of their name precedes (text -> name)."""
    groups: list[_Group] = []
    displaced: dict[str, str] = {}
    previous: list[tuple[int, str]] = []
    for content in wire:
        parts = content.get("parts", [])
        if content.get("role") == "model":
            calls = [p["functionCall"] for p in parts if "functionCall" in p]
            previous = [(_call_serial(c), c["name"]) for c in calls]
            continue
        by_name: dict[str, _Group] = {}
        for serial, name in previous:
            by_name.setdefault(name, _Group(name)).calls.append(serial)
        for part in parts:
            if "functionResponse" in part:
                name, key, text = _response(part)
                if name in by_name:
                    by_name[name].responses.append((key, text))
                else:
                    displaced[text] = name
        groups += by_name.values()
        previous = []
    return groups, displaced


def _answers(wire: list[dict[str, Any]]) -> dict[int, tuple[str, str, str]]:
    """Call serial -> (name, output or error, text) of a transcript the API rules accept."""
    answers: dict[int, tuple[str, str, str]] = {}
    for index, content in enumerate(wire[:-1]):
        calls = [p["functionCall"] for p in content.get("parts", []) if "functionCall" in p]
        responses = [p for p in wire[index + 1].get("parts", []) if "functionResponse" in p]
        for call, part in zip(calls, responses, strict=False):
            answers[_call_serial(call)] = _response(part)
    return answers


def positional_problems(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[str]:
    """How repair of an id-less Gemini transcript ``before`` into ``after`` broke Gemini's own rule.

    Gemini attributes an id-less response by its position in the turn right after the calls
    (the k-th response of a name answers the k-th call of that name), so the truth is read off
    the wire, whatever the generator meant: every real result keeps its kind and its position's
    call, a placeholder gives way to a real result of its group, extras go nowhere else, and a
    displaced response never goes to a call while an earlier call of its name ends unanswered.
    """
    groups, displaced = _positions(before)
    kinds = {
        text: key
        for _, key, text in (_response(p) for c in before for p in c["parts"] if "functionResponse" in p)
    }
    answers = _answers(after)
    problems = [
        f"call {serial}: {text} came back as {key}, was {kinds[text]}"
        for serial, (_, key, text) in answers.items()
        if text in kinds and kinds[text] != key
    ]
    for group in groups:
        problems += _group_problems(group, answers)
    for serial, (name, _, text) in answers.items():
        if text not in displaced:
            continue
        earlier = [s for s, (n, _, t) in answers.items() if s < serial and n == name and t in _PLACEHOLDERS]
        if earlier:
            problems.append(f"displaced {text} went to call {serial}, earlier {earlier} left unanswered")
    return problems


def _group_problems(group: _Group, answers: dict[int, tuple[str, str, str]]) -> list[str]:
    problems = []
    for serial, (key, text) in zip(group.calls, group.responses, strict=False):
        if text not in _PLACEHOLDERS and answers.get(serial, ("", "", ""))[1:] != (key, text):
            problems.append(f"call {serial} lost {text}, its position's response (got {answers.get(serial)})")
    reals = sum(text not in _PLACEHOLDERS for _, text in group.responses)
    answered = sum(answers.get(s, ("", "", OPENCLAW_TEXT))[2] not in _PLACEHOLDERS for s in group.calls)
    if answered < min(len(group.calls), reals):
        problems.append(f"{group.name} calls {group.calls}: {answered} real answers of {reals} available")
    for _, text in group.responses[len(group.calls) :]:
        problems += [
            f"extra {text} went to call {s} of another turn"
            for s, (_, _, t) in answers.items()
            if t == text and s not in group.calls and text not in _PLACEHOLDERS
        ]
    return problems
