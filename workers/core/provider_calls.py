"""Tool calls in a provider's format in, what the agent appends next out, in the same format.

:func:`decode_calls` reads the calls of one assistant message as the provider returned it;
:func:`encode_results` writes the results in the shape the provider expects next:

================  ===========================================  =========================================
format            message in                                   append out
================  ===========================================  =========================================
neutral           ``{"calls": [{id, name, arguments}]}``       list of neutral results
anthropic         assistant message, ``tool_use`` blocks        one ``user`` message of ``tool_result``
openai-chat       assistant message with ``tool_calls``         list of ``role: tool`` messages
openai-responses  list of output items (or ``{"output": …}``)  list of ``function_call_output`` items
gemini            model Content with ``functionCall`` parts     one ``user`` Content of ``functionResponse``
================  ===========================================  =========================================

Reading the message goes through the transcript adapters and writing goes through
``ToolResult.to_*``, which use the adapters' encoders: one encoder per provider.
A call whose arguments cannot be read becomes a :class:`RejectedCall`, answered
``invalid_arguments`` without running; only a message that is not in the format's shape raises.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from workers.core.models import ToolCall, ToolResult
from workers.core.transcript.adapters import FORMATS, anthropic, gemini, openai_chat, openai_responses
from workers.core.transcript.adapters.wire import require_dict, require_list, require_str, unwrap
from workers.errors import LoopDetected, ProviderFormatError, TranscriptRepairError

__all__ = [
    "FORMATS",
    "ParsedCall",
    "ProviderAnswer",
    "ProviderTurn",
    "RejectedCall",
    "check_format",
    "decode_calls",
    "encode_results",
]

_MAX_ID: Final = 256  # ToolCall's limit on ids and names
# Ids this module generates for Gemini calls that came without one (see decode_calls).
_GENERATED_GEMINI_ID: Final = re.compile(r"gemini-(?:[0-9]+|[0-9a-f]{12})-[0-9]+")


class RejectedCall(ToolCall):
    """A call whose arguments could not be read from the message; ``problems`` says why.

    The gateway admits it like any call (loop gate, unknown-tool check) and then answers it
    ``invalid_arguments`` without running it, recorded in the ledger like a call whose
    arguments fail the tool's schema. ``arguments`` is always empty.
    """

    problems: tuple[str, ...]


@dataclass(frozen=True)
class ParsedCall:
    """One call read from a provider message."""

    call: ToolCall
    """The call as the gateway runs it (a :class:`RejectedCall` when its arguments were unreadable)."""
    send_id: bool = True
    """False for a Gemini call that came without an id: its id was generated and is not sent back."""


@dataclass(frozen=True)
class ProviderAnswer:
    """The answer to one assistant message: results in call order and what to append next."""

    results: list[ToolResult]
    append: Any
    """The provider-format value the agent appends (None when a one-message format has no calls)."""
    aborted: dict[str, Any] | None = None
    """``{"reason", "detector", "count"}`` when the loop detector aborted the run, else None."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: neutral results, the append value and the abort."""
        return {
            "results": [r.to_neutral() for r in self.results],
            "append": self.append,
            "aborted": self.aborted,
        }


def check_format(fmt: str) -> str:
    """``fmt`` if it is a known format.

    Raises:
        ProviderFormatError: the format is unknown; the message lists the valid ones.
    """
    if fmt not in FORMATS:
        raise ProviderFormatError(
            None, f"unknown format {fmt!r}; valid formats: {', '.join(FORMATS)}", FORMATS
        )
    return fmt


def decode_calls(fmt: str, message: object, *, turn: int | None = None) -> list[ParsedCall]:
    """The tool calls of one assistant message in ``fmt``, in order.

    Ids are kept exactly as the provider sent them (for the Responses API the item's
    ``call_id``). A Gemini call without an id gets ``gemini-<turn>-<part>``, the id transcript
    repair gives it when this Content is ``contents[turn]``; without ``turn``, a digest of the
    Content stands in for the turn, so the same Content always gets the same ids. The OpenAI
    formats' ``arguments`` must be a string (the message's shape, as for transcript repair);
    what the string holds is the call's own concern.

    Raises:
        ProviderFormatError: unknown format, or the message is not in the format's shape
            (``path`` is the JSON path of the problem: ids and names must be 1 to 256 characters
            and unique within the message).
    """
    reader = _READERS[check_format(fmt)]
    seen: dict[str, str] = {}
    parsed: list[ParsedCall] = []
    try:
        for block, where, id_key, name_key in reader(message, turn):
            call = _call(block, where, id_key, name_key, seen)
            parsed.append(ParsedCall(call, send_id=not block.get(gemini.IMPLICIT_ID)))
    except TranscriptRepairError as exc:
        raise ProviderFormatError(exc.path, exc.reason) from None
    return parsed


def encode_results(fmt: str, results: Sequence[ToolResult], calls: Sequence[ParsedCall] | None = None) -> Any:
    """What the agent appends after the calls: ``results`` in ``fmt``, in the given order.

    ``calls`` (from :func:`decode_calls`) says which Gemini ids were generated and are left
    out; without it, ids of the generated form are left out. Anthropic and Gemini get one
    message, None when there are no results; the other formats a list.

    Raises:
        ProviderFormatError: the format is unknown.
    """
    check_format(fmt)
    if fmt == "neutral":
        return [r.to_neutral() for r in results]
    if fmt == "openai-chat":
        return [r.to_openai() for r in results]
    if fmt == "openai-responses":
        return [r.to_openai_responses() for r in results]
    if not results:
        return None
    if fmt == "anthropic":
        return {"role": "user", "content": [r.to_anthropic() for r in results]}
    if calls is not None:
        hidden = {c.call.id for c in calls if not c.send_id}
    else:
        hidden = {r.tool_call_id for r in results if _GENERATED_GEMINI_ID.fullmatch(r.tool_call_id)}
    return {"role": "user", "parts": [r.to_gemini(send_id=r.tool_call_id not in hidden) for r in results]}


@dataclass(frozen=True)
class ProviderTurn:
    """One assistant message's calls, decoded, and the answer to append once they ran (no I/O).

    The gateway's sync and asyncio drivers run :attr:`calls` (none: no run is opened) and
    hand back the results, or the ``LoopDetected`` that aborted the run: a loop abort is
    answered, not raised, and its results still hold one result per call. A call whose
    arguments cannot be read (not JSON, not an object) is a :class:`RejectedCall` among the
    others: it meets the loop gate and the unknown-tool check like any call, and is then
    answered ``invalid_arguments`` at submission and recorded in the ledger. Nothing is
    answered outside the gateway, so ``collect`` and the loop detector see every call.
    """

    fmt: str
    parsed: tuple[ParsedCall, ...]

    @classmethod
    def decode(cls, fmt: str, message: object, *, turn: int | None = None) -> ProviderTurn:
        """The calls of ``message`` in ``fmt`` (``turn``: see :func:`decode_calls`).

        Raises:
            ProviderFormatError: unknown format, or the message is not in the format's shape.
        """
        return cls(fmt, tuple(decode_calls(fmt, message, turn=turn)))

    @property
    def calls(self) -> list[ToolCall]:
        """The calls to run, in message order."""
        return [p.call for p in self.parsed]

    def answer(self, results: Sequence[ToolResult] | LoopDetected) -> ProviderAnswer:
        """The :class:`ProviderAnswer` for the calls' ``results``, or for the loop abort that holds them."""
        abort = results if isinstance(results, LoopDetected) else None
        answered: list[ToolResult] = list(results.results if isinstance(results, LoopDetected) else results)
        aborted = (
            None
            if abort is None
            else {"reason": str(abort), "detector": abort.detector, "count": abort.count}
        )
        return ProviderAnswer(answered, encode_results(self.fmt, answered, self.parsed), aborted)


# -- reading -----------------------------------------------------------------------------------

# Each reader yields (neutral toolCall block, JSON path of the call, key of its id, key of its name).
_Found = Iterator[tuple[dict[str, Any], str, str, str]]


def _anthropic(message: object, turn: int | None) -> _Found:
    raw = _assistant(message, "assistant")
    neutral = anthropic.assistant_in(raw)
    content = raw["content"] if isinstance(raw["content"], list) else []
    for i, block in enumerate(content):
        if block.get("type") == "tool_use":
            yield neutral["content"][i], f"$.content[{i}]", "id", "name"


def _openai_chat(message: object, turn: int | None) -> _Found:
    raw = _assistant(message, "assistant")
    blocks = openai_chat.assistant_in(raw)["content"]
    count = len(raw.get("tool_calls") or [])
    for i, block in enumerate(blocks[len(blocks) - count :]):
        yield block, f"$.tool_calls[{i}]", "id", "function.name"


def _openai_responses(message: object, turn: int | None) -> _Found:
    items, path = unwrap(message, "output")
    for i, raw in enumerate(items):
        where = f"{path}[{i}]"
        item = require_dict(raw, where)
        if item.get("type") == "function_call":
            block = openai_responses.function_call_in(item, where)
            yield block | {"id": item["call_id"]}, where, "call_id", "name"


def _gemini(message: object, turn: int | None) -> _Found:
    key: int | str = turn if turn is not None else _digest(message)
    neutral = gemini.model_content_in(message, "$", key)
    for i, block in enumerate(neutral["content"]):
        if block.get("type") == "toolCall":
            yield block, f"$.parts[{i}].functionCall", "id", "name"


def _neutral(message: object, turn: int | None) -> _Found:
    calls = require_list(require_dict(message, "$").get("calls"), "$.calls")
    for i, raw in enumerate(calls):
        where = f"$.calls[{i}]"
        call = require_dict(raw, where)
        call_id = require_str(call.get("id"), f"{where}.id")
        name = require_str(call.get("name"), f"{where}.name")
        yield {"id": call_id, "name": name, "arguments": call.get("arguments")}, where, "id", "name"


_READERS: Final[dict[str, Callable[[object, int | None], _Found]]] = {
    "neutral": _neutral,
    "anthropic": _anthropic,
    "openai-chat": _openai_chat,
    "openai-responses": _openai_responses,
    "gemini": _gemini,
}


def _assistant(message: object, role: str) -> dict[str, Any]:
    raw = require_dict(message, "$")
    if raw.get("role", role) != role:
        raise ProviderFormatError("$.role", f'expected "{role}"')
    return raw


def _digest(message: object) -> str:
    canonical = json.dumps(message, sort_keys=True, ensure_ascii=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()[:12]


def _call(block: dict[str, Any], where: str, id_key: str, name_key: str, seen: dict[str, str]) -> ToolCall:
    call_id = _checked_text(block["id"], f"{where}.{id_key}")
    name = _checked_text(block["name"], f"{where}.{name_key}")
    if call_id in seen:
        raise ProviderFormatError(f"{where}.{id_key}", f"call id {call_id!r} repeats {seen[call_id]}")
    seen[call_id] = f"{where}.{id_key}"
    arguments, problems = _read_arguments(block.get("arguments"))
    if problems:
        return RejectedCall(id=call_id, name=name, problems=tuple(problems))
    return ToolCall(id=call_id, name=name, arguments=arguments)


def _checked_text(value: str, path: str) -> str:
    if not 1 <= len(value) <= _MAX_ID:
        raise ProviderFormatError(path, f"expected 1 to {_MAX_ID} characters, got {len(value)}")
    if not _is_unicode(value):
        raise ProviderFormatError(path, "not valid Unicode (an unpaired surrogate)")
    return value


class _Unreadable(ValueError):
    """JSON that parses but cannot be taken as arguments (a repeated key, NaN)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        repeated = next(key for key in keys if keys.count(key) > 1)
        raise _Unreadable(f"arguments repeat the key {repeated!r}")
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise _Unreadable(f"arguments contain {name}, which is not JSON")


def _read_arguments(value: object) -> tuple[dict[str, Any], list[str]]:
    """Call arguments as an object, and the problems that make them unreadable (then ``{}``).

    Accepted: an object, a string holding a JSON object, or nothing (null or missing: no
    arguments). Refused: invalid JSON, JSON that is not an object, repeated keys, NaN or
    Infinity, text that is not valid Unicode.
    """
    if value is None:
        return {}, []
    if isinstance(value, str):
        try:
            value = json.loads(value, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
        except _Unreadable as exc:
            return {}, [str(exc)]
        except ValueError as exc:
            return {}, [f"arguments are not valid JSON ({exc})"]
    if not isinstance(value, dict):
        return {}, [f"arguments must be a JSON object, not {_json_type(value)}"]
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return {}, [f"arguments are not JSON values ({exc})"]
    if not _is_unicode(text):
        return {}, ["arguments contain text that is not valid Unicode (an unpaired surrogate)"]
    return value, []


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    return type(value).__name__
