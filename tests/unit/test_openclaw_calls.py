"""OpenClaw's own calls as unstuck judges them: budgets, overdue calls, silent sessions."""

from __future__ import annotations

import pytest

from workers.core.openclaw_calls import (
    OpenClawCall,
    OpenClawCallState,
    overdue,
    overdue_note,
    silent_sessions,
)
from workers.errors import ConfigError
from workers.settings import load_settings


def _call(call_id: str, deadline_ms: int, state: OpenClawCallState = OpenClawCallState.OPEN) -> OpenClawCall:
    return OpenClawCall("s", "r", "main", "exec", call_id, 0, deadline_ms, state)


def test_budgets_have_a_default_and_per_tool_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNSTUCK_OPENCLAW__BUDGETS_S", '{"exec": 5, "*": 120}')
    settings = load_settings()
    assert settings.openclaw.budget_s("exec") == 5
    assert settings.openclaw.budget_s("web_fetch") == 120


def test_budgets_without_a_default_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNSTUCK_OPENCLAW__BUDGETS_S", '{"exec": 5}')
    with pytest.raises(ConfigError, match=r"openclaw\.budgets_s"):
        load_settings()


def test_overdue_calls_are_the_open_ones_past_their_deadline_oldest_first() -> None:
    calls = [_call("b", 2_000), _call("a", 1_000), _call("c", 9_000), _call("d", 500, OpenClawCallState.DONE)]
    assert [c.call_id for c in overdue(calls, now_ms=2_000)] == ["a", "b"]


def test_the_note_says_what_was_done_and_that_nothing_was_retried() -> None:
    note = overdue_note(_call("x", 5_000), OpenClawCallState.KILLED)
    assert "x" in note
    assert "5 s" in note
    assert "killed" in note
    assert "not retried" in note


def test_only_sessions_with_an_open_call_and_no_activity_are_silent() -> None:
    activity = {"quiet": 0, "busy": 9_000, "idle": 0}
    assert silent_sessions(activity, {"quiet", "busy"}, now_ms=10_000, stuck_after_s=5) == [("quiet", 10.0)]
