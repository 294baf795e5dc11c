"""What ``unstuck demo`` prints: one row per call, and the exactly-one-result invariant."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workers.core.models import ToolCall, ToolResult

__all__ = ["Invariant", "Row", "check_invariant", "render_table", "report_json"]


@dataclass
class Row:
    """One call of the scripted session and what came back for it."""

    scenario: str
    label: str
    expected: str
    call: ToolCall
    via: str = "call_tools"
    result: ToolResult | None = None
    latency_s: float | None = None
    deadline_s: float | None = None
    grace_s: float = 0.0

    @property
    def outcome(self) -> str:
        """``ok``, ``error`` (the tool raised) or ``synthetic`` (unstuck answered); ``missing``."""
        if self.result is None:
            return "missing"
        if self.result.synthetic:
            return "synthetic"
        return "error" if self.result.is_error else "ok"

    @property
    def as_expected(self) -> bool:
        """Whether the call got the outcome (``ok``) or reason the scenario is about."""
        if self.result is None:
            return False
        if self.expected == "ok":
            return not self.result.is_error
        return self.result.reason == self.expected

    @property
    def on_time(self) -> bool | None:
        """Whether the result came no later than the deadline plus grace (None if unknown)."""
        if self.latency_s is None or self.deadline_s is None:
            return None
        return self.latency_s <= self.deadline_s + self.grace_s

    def to_json(self, number: int) -> dict[str, Any]:
        """The row as a JSON object."""
        result = self.result
        return {
            "n": number,
            "scenario": self.scenario,
            "label": self.label,
            "call_id": self.call.id,
            "tool": self.call.name,
            "via": self.via,
            "expected": self.expected,
            "outcome": self.outcome,
            "reason": result.reason if result else None,
            "is_error": result.is_error if result else None,
            "synthetic": result.synthetic if result else None,
            "latency_s": self.latency_s,
            "deadline_s": self.deadline_s,
            "on_time": self.on_time,
            "as_expected": self.as_expected,
            "text": result.text if result else None,
        }


@dataclass(frozen=True)
class Invariant:
    """Calls submitted versus results delivered to the agent."""

    calls: int
    results: int
    missing: int
    duplicates: int

    @property
    def holds(self) -> bool:
        """Exactly one result per call."""
        return self.missing == 0 and self.duplicates == 0 and self.results == self.calls

    @property
    def line(self) -> str:
        """``N calls → N results, 0 missing, 0 duplicates`` with the real counts."""
        return (
            f"{self.calls} calls → {self.results} results, "
            f"{self.missing} missing, {self.duplicates} duplicates"
        )


def check_invariant(call_ids: Sequence[str], delivered: Sequence[ToolResult]) -> Invariant:
    """Count missing calls and results beyond one per call id among everything delivered."""
    per_call = Counter(result.tool_call_id for result in delivered)
    missing = sum(1 for call_id in call_ids if per_call[call_id] == 0)
    duplicates = sum(count - 1 for count in per_call.values() if count > 1)
    return Invariant(len(call_ids), len(delivered), missing, duplicates)


def _timing(row: Row) -> str:
    if row.latency_s is None:
        return "-"
    if not row.deadline_s:
        return f"{row.latency_s:6.2f}s / rejected at submit"
    mark = "on time" if row.on_time else "LATE"
    return f"{row.latency_s:6.2f}s / {row.deadline_s:5.1f}s {mark}"


def render_table(rows: Sequence[Row], invariant: Invariant) -> str:
    """The human table: one line per call, then the invariant line."""
    header = ("#", "scenario", "tool", "outcome", "reason", "latency / deadline", "")
    lines = [header]
    for number, row in enumerate(rows, 1):
        reason = row.result.reason if row.result and row.result.reason else "-"
        tool = row.call.name + (" (collect)" if row.via == "collect" else "")
        mark = "✓" if row.as_expected else f"✗ expected {row.expected}"
        lines.append((str(number), row.label, tool, row.outcome, reason, _timing(row), mark))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
    out.insert(1, "  ".join("-" * width for width in widths[:-1]))
    return "\n".join([*out, "", invariant.line])


def report_json(rows: Sequence[Row], invariant: Invariant, **extra: Any) -> dict[str, Any]:
    """The whole report as one JSON object."""
    return {
        **extra,
        "calls": [row.to_json(number) for number, row in enumerate(rows, 1)],
        "invariant": {
            "calls": invariant.calls,
            "results": invariant.results,
            "missing": invariant.missing,
            "duplicates": invariant.duplicates,
            "holds": invariant.holds,
            "line": invariant.line,
        },
        "all_as_expected": all(row.as_expected for row in rows),
    }
