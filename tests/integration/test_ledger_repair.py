"""Ledger-aware transcript repair: a gap is filled with what really happened before inventing."""

from __future__ import annotations

import pytest

from tests.harness import Proc
from workers import ToolCall, ToolGateway
from workers.core.models import SyntheticReason
from workers.core.results import success_result, synthetic_result


def _transcript(*call_ids: str) -> list[dict[str, object]]:
    calls = [{"type": "toolCall", "id": cid, "name": "echo", "arguments": {"text": cid}} for cid in call_ids]
    return [
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
        {"role": "assistant", "content": calls, "stopReason": "toolUse"},
        {"role": "user", "content": [{"type": "text", "text": "and then?"}]},
    ]


def _result_for(messages: list[dict[str, object]], call_id: str) -> dict[str, object]:
    return next(m for m in messages if m.get("role") == "toolResult" and m.get("toolCallId") == call_id)


@pytest.mark.timeout(60)
def test_missing_result_is_filled_from_the_ledger_then_synthesised(
    worker: Proc, gateway: ToolGateway
) -> None:
    # Given a call that really ran, and one the ledger never saw
    gateway.call_tools(
        session_key="rep", run_id="r", calls=[ToolCall(id="ran", name="echo", arguments={"text": "hi"})]
    )
    # When a transcript that lost both results is repaired
    repaired, outcome = gateway.repair("rep", "r", _transcript("ran", "never"), provider="openai")
    # Then the real result comes back, and only the unknown call gets a synthetic one
    real = _result_for(repaired, "ran")
    assert real["content"] == [{"type": "text", "text": "hi"}]
    assert real["details"]["synthetic"] is False  # type: ignore[index]
    invented = _result_for(repaired, "never")
    assert invented["details"] == {"synthetic": True, "reason": "missing_tool_result"}
    assert outcome.report is not None


@pytest.mark.timeout(30)
def test_a_late_real_result_beats_the_synthetic_one_delivered(gateway: ToolGateway) -> None:
    # Given a call answered worker_lost whose tool later finished anyway
    ledger = gateway._rt.ledger
    keys = ledger.keys("rep2", "r")
    call = ToolCall(id="lost", name="echo", arguments={"text": "x"})
    ledger.register(keys, "lost", now_ms=1, deadline_ms=10, fields={"tool": "echo"})
    ledger.finish(
        keys,
        synthetic_result(call, SyntheticReason.WORKER_LOST, elapsed_ms=5, attempt=1),
        now_ms=5,
        writer="t",
    )
    ledger.finish(keys, success_result(call, "done late", elapsed_ms=9, attempt=1), now_ms=9, writer="t")
    # When the transcript is repaired
    repaired, _ = gateway.repair("rep2", "r", _transcript("lost"), provider="anthropic")
    # Then the model sees what really happened
    assert _result_for(repaired, "lost")["content"] == [{"type": "text", "text": "done late"}]
