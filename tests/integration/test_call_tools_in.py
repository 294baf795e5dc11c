"""ToolGateway.call_tools_in against a real worker: each provider's message in, its exact append out."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.harness import Proc, base_env
from workers import ToolGateway, ToolResult
from workers.errors import ProviderFormatError
from workers.settings import Settings

# Four calls: one that works, one whose tool raises, an unknown tool, unreadable arguments.
OK = ("c-ok", "echo", {"text": "ab", "times": 2})
BOOM = ("c-boom", "boom", {"message": "disk full"})
GHOST = ("c-ghost", "ecko", {"text": "x"})
BAD = ("c|bad ü", "echo", '{"text": "never closed')  # an id with odd characters, too
CALLS = [OK, BOOM, GHOST, BAD]
REASONS = [None, "tool_error", "unknown_tool", "invalid_arguments"]


def _as_string(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _message(fmt: str) -> Any:
    if fmt == "neutral":
        return {"calls": [{"id": i, "name": n, "arguments": a} for i, n, a in CALLS]}
    if fmt == "anthropic":
        blocks = [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in CALLS]
        return {"role": "assistant", "content": [{"type": "text", "text": "on it"}, *blocks]}
    if fmt == "openai-chat":
        calls = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": _as_string(a)}}
            for i, n, a in CALLS
        ]
        return {"role": "assistant", "content": None, "tool_calls": calls}
    if fmt == "openai-responses":
        return [{"type": "reasoning", "id": "rs_1", "summary": []}] + [
            {"type": "function_call", "id": f"fc_{k}", "call_id": i, "name": n, "arguments": _as_string(a)}
            for k, (i, n, a) in enumerate(CALLS)
        ]
    # Gemini, as it usually comes: calls without ids
    return {"role": "model", "parts": [{"functionCall": {"name": n, "args": a}} for _, n, a in CALLS]}


def _expected_append(fmt: str, results: list[ToolResult]) -> Any:
    ids = [i for i, _, _ in CALLS]
    if fmt == "neutral":
        return [r.to_neutral() for r in results]
    if fmt == "anthropic":
        blocks = [
            {
                "type": "tool_result",
                "tool_use_id": i,
                "content": [{"type": "text", "text": r.text}],
                "is_error": r.is_error,
            }
            for i, r in zip(ids, results, strict=True)
        ]
        return {"role": "user", "content": blocks}
    if fmt == "openai-chat":
        return [
            {"role": "tool", "tool_call_id": i, "content": r.text} for i, r in zip(ids, results, strict=True)
        ]
    if fmt == "openai-responses":
        return [
            {"type": "function_call_output", "call_id": i, "output": r.text}
            for i, r in zip(ids, results, strict=True)
        ]
    parts = [
        {"functionResponse": {"name": n, "response": {"error" if r.is_error else "output": r.text}}}
        for (_, n, _), r in zip(CALLS, results, strict=True)
    ]
    return {"role": "user", "parts": parts}


@pytest.fixture
def env(redis_url: str) -> dict[str, str]:
    # Built-ins are off by default; these tests use them, so they enable them explicitly.
    return base_env(redis_url, UNSTUCK_TOOLS__BUILTINS="exec,http_fetch")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", ["neutral", "anthropic", "openai-chat", "openai-responses", "gemini"])
def test_each_format_gets_one_result_per_call_and_the_exact_append(
    worker: Proc, gateway: ToolGateway, fmt: str
) -> None:
    # Given an assistant message in the provider's format
    message = _message(fmt)
    # When
    answer = gateway.call_tools_in(fmt, message, session_key=f"s-{fmt}", run_id="r1", turn=1)
    # Then one result per call, in call order, each with the right outcome
    assert [r.reason for r in answer.results] == REASONS
    assert answer.results[0].text == "abab"
    assert "disk full" in answer.results[1].text
    assert "closest: echo" in answer.results[2].text
    assert "not valid JSON" in answer.results[3].text
    assert answer.aborted is None
    # And the append value has exactly the provider's shape
    assert answer.append == _expected_append(fmt, answer.results)
    assert json.loads(json.dumps(answer.append)) == answer.append
    # And every call, the rejected ones too, is in the ledger: a new gateway collects them
    ids = [r.tool_call_id for r in answer.results]
    if fmt == "gemini":
        assert ids == [f"gemini-1-{k}" for k in range(4)]
    else:
        assert ids == [i for i, _, _ in CALLS]
    later = ToolGateway(gateway.settings)
    try:
        collected = {r.tool_call_id: r for r in later.collect(f"s-{fmt}", "r1")}
        assert [collected[i] for i in ids] == answer.results
        assert later.results_in(fmt, [collected[i] for i in ids]) == answer.append
    finally:
        later.close()


@pytest.mark.timeout(60)
async def test_the_async_twin_answers_the_same(worker: Proc, agateway: ToolGateway) -> None:
    message = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "a1", "name": "echo", "input": {"text": "hi"}}],
    }
    answer = await agateway.acall_tools_in("anthropic", message, session_key="async", run_id="r1")
    assert answer.append == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "a1",
                "content": [{"type": "text", "text": "hi"}],
                "is_error": False,
            }
        ],
    }


@pytest.mark.timeout(30)
def test_unreadable_arguments_pass_the_loop_guard_like_any_call(gateway: ToolGateway) -> None:
    # Given no worker (nothing here needs one) and a run that compacted its context
    def bad_call(k: int) -> dict[str, Any]:
        call = {"id": f"k{k}", "type": "function", "function": {"name": "echo", "arguments": "{oops"}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}

    gateway.call_tools_in("openai-chat", bad_call(0), session_key="loop", run_id="r1")
    assert gateway.note_compaction("loop", "r1")
    # When the model repeats the same unreadable call
    answers = [
        gateway.call_tools_in("openai-chat", bad_call(k), session_key="loop", run_id="r1")
        for k in range(1, 8)
    ]
    # Then the post-compaction guard aborts the run as for any call answered at submission,
    # and the abort is data, not an exception: results and append are still there
    aborted = [a for a in answers if a.aborted is not None]
    assert aborted
    assert aborted[0].aborted is not None
    assert aborted[0].aborted["detector"] == "compaction_loop_persisted"
    assert aborted[0].aborted["count"] >= 3
    assert aborted[0].results[0].reason == "invalid_arguments"
    assert aborted[0].append[0]["role"] == "tool"
    # And the run stays aborted: a later valid call is refused without running
    valid = {
        "role": "assistant",
        "tool_calls": [{"id": "v", "function": {"name": "echo", "arguments": '{"text": "x"}'}}],
    }
    later = gateway.call_tools_in("openai-chat", valid, session_key="loop", run_id="r1")
    assert later.results[0].reason == "run_aborted"
    assert later.aborted is not None


@pytest.mark.timeout(30)
def test_no_calls_touch_nothing_and_a_malformed_message_records_nothing(gateway: ToolGateway) -> None:
    ledger = gateway._rt.ledger
    keys = ledger.keys("quiet", "r1")
    # A message without calls: nothing to append, no run opened
    answer = gateway.call_tools_in(
        "gemini", {"role": "model", "parts": [{"text": "done"}]}, session_key="quiet", run_id="r1"
    )
    assert (answer.results, answer.append, answer.aborted) == ([], None, None)
    # A malformed message: a typed error naming the path, and nothing recorded
    broken = {"role": "assistant", "content": [{"type": "tool_use", "id": "c", "name": 3, "input": {}}]}
    with pytest.raises(ProviderFormatError) as caught:
        gateway.call_tools_in("anthropic", broken, session_key="quiet", run_id="r1")
    assert caught.value.path == "$.content[0].name"
    with pytest.raises(ProviderFormatError, match="valid formats"):
        gateway.call_tools_in("claude", broken, session_key="quiet", run_id="r1")
    assert ledger.run_call_ids(keys) == []
    assert ledger.record(keys, "c") is None


def test_tool_definitions_come_from_the_registry(gateway: ToolGateway) -> None:
    definitions = gateway.tool_definitions(format="openai-chat", names=["echo"])
    assert definitions == [
        {
            "type": "function",
            "function": {
                "name": "echo",
                "description": "Healthy tool.",
                "parameters": {
                    "additionalProperties": False,
                    "properties": {
                        "text": {"title": "Text", "type": "string"},
                        "times": {"default": 1, "title": "Times", "type": "integer"},
                    },
                    "required": ["text"],
                    "type": "object",
                },
            },
        }
    ]
    names = [d["name"] for d in gateway.tool_definitions(format="gemini")[0]["functionDeclarations"]]
    assert {"echo", "boom", "exec", "http_fetch"} <= set(names)
    assert names == sorted(names)


def test_tool_definitions_for_an_agent_list_only_what_it_may_call(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a global allowlist and an agent that narrows it further
    monkeypatch.setenv("UNSTUCK_TOOLS__ALLOW", "echo,boom,group:builtins")
    monkeypatch.setenv(
        "UNSTUCK_AGENTS__LIST",
        '[{"id": "reader", "tool_allow": ["echo", "http_fetch", "exec"], "tool_deny": ["exec"]}]',
    )
    gateway = ToolGateway(Settings())
    try:
        # When definitions are asked per agent
        def listed(agent_id: str | None) -> list[str]:
            return [d["name"] for d in gateway.tool_definitions(format="neutral", agent_id=agent_id)]

        # Then each agent sees only what it may call; without an agent, every registered tool
        assert listed("main") == ["boom", "echo", "exec", "http_fetch"]
        assert listed("reader") == ["echo", "http_fetch"]
        assert {"sleepy", "exec"} <= set(listed(None))
    finally:
        gateway.close()
