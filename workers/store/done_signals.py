"""The wake-up signals on a run's ``done`` list: which call was answered, and its result.

The winning finish (``ledger_finish.lua``) pushes ``<result JSON> US <call id>``, ``US`` being
the ASCII unit separator U+001F, so that the waiter it wakes has the answer without reading
the call record. JSON text never holds a raw U+001F (RFC 8259: control characters in strings
are escaped, and only space, tab, CR and LF may stand between tokens), so the *first* U+001F
of a signal is the separator, whatever the call id holds; and JSON never starts with
:data:`HANDED_BACK`, so a handed-back signal is told apart from one whose call id starts with
it. That costs a concatenation in Lua and one scan in Python; a length prefix would need
Lua's byte count to agree with Python's code-point count, which it does not for non-ASCII.

A signal without a separator is the older form, the bare call id (pushed by a worker not yet
upgraded): it carries no result, and its waiter reads the record as before. A bare id that
holds U+001F reads as a signal with a result; that result is used only when it parses as the
answer to the call it names (:meth:`Signal.answer`), so such a signal costs at worst a read,
never a wrong answer.

A signal one waiter gives back to the run's other waiters is the popped signal, result and
all, behind :data:`HANDED_BACK` (see :meth:`workers.store.ledger.Ledger.wait_for_done`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from workers.core.models import ToolResult

__all__ = ["HANDED_BACK", "SEPARATOR", "Signal", "encode", "results_of"]

HANDED_BACK: Final = "\x00"  # marks a wake-up signal one waiter gave back to the run's other waiters
SEPARATOR: Final = "\x1f"  # between the result JSON and the call id ('\31' in ledger_finish.lua)


def encode(call_id: str, result_json: str) -> str:
    """The signal a winning finish pushes: the Python twin of ``ledger_finish.lua``'s."""
    return result_json + SEPARATOR + call_id


@dataclass(frozen=True)
class Signal:
    """One popped signal: its call, the result JSON it carries (None: a bare id), and its form."""

    raw: str  # as popped, what a hand-back pushes again behind HANDED_BACK
    call_id: str
    result: str | None
    handed_back: bool

    @classmethod
    def parse(cls, raw: str) -> Signal:
        """Read a signal of either form, handed back or not."""
        body = raw.removeprefix(HANDED_BACK)
        result, separator, call_id = body.partition(SEPARATOR)
        if not separator:
            return cls(raw, body, None, raw.startswith(HANDED_BACK))
        return cls(raw, call_id, result, raw.startswith(HANDED_BACK))

    def answer(self) -> ToolResult | None:
        """The result carried, when it is the answer to this signal's call."""
        if self.result is None:
            return None
        results = results_of({self.call_id: self.result})
        return None if results is None else results.get(self.call_id)

    def marked(self) -> str:
        """What a waiter pushes to hand this signal back to the run's other waiters."""
        return HANDED_BACK + self.raw


def results_of(stored: Mapping[str, str | None]) -> dict[str, ToolResult] | None:
    """The results among ``stored`` (call id -> JSON, or None when there is none yet).

    None when one of them is not its call's answer: only a bare id misread as a signal with
    a result can bring one (see the module docstring), and then its waiter reads the records.
    """
    results: dict[str, ToolResult] = {}
    for call_id, raw in stored.items():
        if not raw:
            continue
        try:
            result = ToolResult.from_json(raw)
        except ValueError:  # pydantic's ValidationError, for JSON that is no result
            return None
        if result.tool_call_id != call_id:
            return None
        results[call_id] = result
    return results
