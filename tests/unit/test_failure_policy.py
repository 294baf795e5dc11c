"""Fallbacks, fail-branches and config retry: the pure rules and the worker's use of them."""

from __future__ import annotations

from typing import Any

import pytest
from billiard.exceptions import SoftTimeLimitExceeded

from tests.unit.test_execution import FakeClock, _ctx, _job, _register, written
from workers.answering.rules import apply_fallback
from workers.core.failure_policy import (
    FALLBACK_REASONS,
    BranchRule,
    FailureRules,
    FallbackRule,
    branch_answer,
)
from workers.core.models import RetryPolicy, SyntheticReason, ToolCall
from workers.core.results import deadline_result, success_result, synthetic_result, tool_error_result
from workers.errors import ConfigError
from workers.settings import RetrySettings
from workers.tools.registry import tool
from workers.worker.execution import run_tool, soft_timeout_result

CALL = ToolCall(id="c1", name="web_fetch")
_R = SyntheticReason


pytestmark = pytest.mark.usefixtures("isolated_registry")  # tests register tools of their own


# --- the pure rules --------------------------------------------------------------------------


@pytest.mark.parametrize("reason", sorted(FALLBACK_REASONS))
def test_fallback_answers_every_failure_reason(reason: SyntheticReason) -> None:
    failure = synthetic_result(CALL, reason, elapsed_ms=7, attempt=2)
    result = apply_fallback(failure, FallbackRule({"cached": True}))
    assert result.is_error is False
    assert result.text == '{"cached": true}'
    assert result.details == {
        "synthetic": True,
        "fallback": True,
        "reason": reason.value,
        "elapsed_ms": 7,
        "attempt": 2,
    }


@pytest.mark.parametrize(
    "reason", [_R.LOOP_BLOCKED, _R.TOOL_NOT_ALLOWED, _R.INVALID_ARGUMENTS, _R.UNKNOWN_TOOL, _R.RUN_ABORTED]
)
def test_refusals_are_never_answered_by_a_fallback(reason: SyntheticReason) -> None:
    # The model must change what it asks: a default value would hide that
    refusal = synthetic_result(CALL, reason, elapsed_ms=0, attempt=0)
    assert apply_fallback(refusal, FallbackRule("x")) is refusal


def test_fallback_for_chosen_reasons_only() -> None:
    rule = FallbackRule("offline", (_R.DEADLINE_EXCEEDED,))
    late = deadline_result(CALL, submitted_ms=0, deadline_ms=5000)
    assert apply_fallback(late, rule).text == "offline"
    failed = tool_error_result(CALL, "OSError", "boom", elapsed_ms=1, attempt=1)
    assert apply_fallback(failed, rule) is failed


def test_fallback_is_deterministic_and_idempotent() -> None:
    # The gateway (store down) and the watchdog compose the same deadline answer: same bytes
    rule = FallbackRule([1, 2])
    first = apply_fallback(deadline_result(CALL, submitted_ms=10, deadline_ms=5010), rule)
    second = apply_fallback(deadline_result(CALL, submitted_ms=10, deadline_ms=5010), rule)
    assert first.to_json() == second.to_json()
    assert apply_fallback(first, rule) is first


def test_fallback_keeps_the_failures_own_facts() -> None:
    # A cancelled tool's partial output and the error type stay visible to operators
    cancelled = synthetic_result(CALL, _R.CANCELLED, elapsed_ms=3, attempt=1, extra={"partial": "half"})
    assert apply_fallback(cancelled, FallbackRule("x")).details["partial"] == "half"
    failed = tool_error_result(CALL, "OSError", "boom", elapsed_ms=1, attempt=1)
    answer = apply_fallback(failed, FallbackRule("x"))
    assert answer.details["error_type"] == "OSError"
    assert answer.details["synthetic"] is True


def test_circuit_open_gets_the_fallback() -> None:
    open_circuit = synthetic_result(
        CALL, _R.CIRCUIT_OPEN, elapsed_ms=0, attempt=0, extra={"retry_after_s": 3}
    )
    answer = apply_fallback(open_circuit, FallbackRule("cached"))
    assert (answer.is_error, answer.text, answer.details["retry_after_s"]) == (False, "cached", 3)


def test_success_is_never_replaced() -> None:
    ok = success_result(CALL, "fine", elapsed_ms=1, attempt=1)
    assert apply_fallback(ok, FallbackRule("x")) is ok


def test_branch_answer_keeps_the_call_and_names_the_branch() -> None:
    first = tool_error_result(CALL, "TimeoutError", "slow", elapsed_ms=100, attempt=1)
    second = success_result(ToolCall(id="c1", name="cached_fetch"), "cached page", elapsed_ms=150, attempt=1)
    answer = branch_answer(first, second, "cached_fetch")
    assert (answer.tool_call_id, answer.tool_name, answer.is_error) == ("c1", "web_fetch", False)
    assert answer.text == "cached page"
    assert answer.details["answered_by"] == "cached_fetch"
    assert answer.details["branch_reason"] == "tool_error"
    assert "TimeoutError" in answer.details["first_error"]


def test_branch_rule_covers_only_its_reasons() -> None:
    rule = BranchRule("b", (_R.TIMEOUT_SOFT,))
    assert rule.covers("timeout_soft")
    assert not rule.covers("tool_error")
    assert not rule.covers(None)


def test_retry_policy_by_exception_name_matches_along_the_bases() -> None:
    policy = RetrySettings(attempts=3, errors=("OSError",)).policy()
    assert policy.should_retry(ConnectionError(), 1)  # ConnectionError derives from OSError
    assert not policy.should_retry(ValueError(), 1)
    assert not policy.should_retry(ConnectionError(), 3)
    every = RetrySettings(attempts=2).policy()
    assert every.should_retry(ValueError(), 1)


# --- the decorator --------------------------------------------------------------------------


def test_decorator_refuses_unknown_reasons_and_a_branch_to_itself() -> None:
    def f() -> None: ...

    with pytest.raises(ConfigError, match="is not one of"):
        tool(name="f1", fallback=1, fallback_on=("loop_blocked",))(f)
    with pytest.raises(ConfigError, match="its own fail-branch"):
        tool(name="f2", fail_branch="f2")(f)


# --- on the worker --------------------------------------------------------------------------


def _run(name: str, rules: FailureRules | None = None, clock: FakeClock | None = None, **kw: Any) -> Any:
    """What the worker writes for a call of ``name``: its run, then the answering service's fallbacks."""
    clock = clock or FakeClock()
    rules = rules or FailureRules()
    result = run_tool(
        _job(name, {"url": "u"}), _ctx(), clock_ms=clock.ms, sleep=clock.sleep, rules=rules, **kw
    )
    return written(result, rules)


def test_decorator_fail_branch_answers_a_tool_error() -> None:
    def cached(url: str) -> str:
        return f"cached {url}"

    branch = _register(cached)

    def fetch(url: str) -> str:
        raise TimeoutError("upstream slow")

    result = _run(_register(fetch, fail_branch=branch))
    assert result.is_error is False
    assert result.text == "cached u"
    assert result.details["answered_by"] == branch
    assert result.details["branch_reason"] == "tool_error"


def test_first_error_in_the_details_is_masked() -> None:
    def cached(url: str) -> str:
        return "ok"

    branch = _register(cached)

    def fetch(url: str) -> str:
        raise PermissionError("token=sk-abcdefghijklmnopqrstuvwxyz0123456789 rejected")

    result = _run(_register(fetch, fail_branch=branch))
    assert "sk-abcdefghijklmnopqrstuvwxyz0123456789" not in result.details["first_error"]
    assert "PermissionError" in result.details["first_error"]


def test_failing_branch_answers_its_own_error_then_the_fallback() -> None:
    def cached(url: str) -> str:
        raise KeyError(url)

    branch = _register(cached)

    def fetch(url: str) -> str:
        raise TimeoutError("slow")

    name = _register(fetch, fail_branch=branch)
    failed = _run(name)
    assert failed.is_error is True
    assert "KeyError" in failed.text
    assert failed.details["answered_by"] == branch
    # With a config fallback, the branch's failure is answered by the default value, still named
    rules = FailureRules(fallbacks={name: FallbackRule("nothing cached")})
    fallback = _run(name, rules)
    assert (fallback.is_error, fallback.text) == (False, "nothing cached")
    assert fallback.details["answered_by"] == branch
    assert fallback.details["fallback"] is True


def test_branch_whose_schema_refuses_the_arguments_is_skipped() -> None:
    def other(query: int) -> str:
        return "never"

    branch = _register(other)

    def fetch(url: str) -> str:
        raise TimeoutError("slow")

    result = _run(_register(fetch, fail_branch=branch))
    assert result.is_error is True
    assert result.details["branch_skipped"] == f"{branch}: InvalidArguments"


def test_branch_the_agent_may_not_call_is_skipped() -> None:
    def cached(url: str) -> str:
        return "never"

    branch = _register(cached)

    def fetch(url: str) -> str:
        raise TimeoutError("slow")

    result = _run(_register(fetch, fail_branch=branch), allows=lambda tool: tool != branch)
    assert result.is_error is True
    assert result.details["branch_skipped"] == f"{branch}: not allowed for this agent"


def test_config_branch_and_retry_replace_the_decorators() -> None:
    calls: list[str] = []

    def cached(url: str) -> str:
        return "from config branch"

    config_branch = _register(cached)

    def fetch(url: str) -> str:
        calls.append(url)
        raise ConnectionError("down")

    name = _register(fetch, retry=RetryPolicy(attempts=5, backoff_s=0, retry_on=(Exception,)))
    rules = FailureRules(
        branches={name: BranchRule(config_branch)},
        retries={name: RetrySettings(attempts=2, backoff_s=0.25, errors=("OSError",)).policy()},
    )
    clock = FakeClock()
    result = _run(name, rules, clock)
    assert len(calls) == 2  # config's 2 attempts, not the decorator's 5
    assert clock.sleeps == [0.25]
    assert result.text == "from config branch"
    assert result.details["answered_by"] == config_branch


def test_config_fallback_wins_over_the_decorators_on_the_worker() -> None:
    def fetch(url: str) -> str:
        raise ValueError("bad")

    name = _register(fetch, fallback="from decorator")
    assert _run(name).text == "from decorator"
    assert _run(name, FailureRules(fallbacks={name: FallbackRule("from config")})).text == "from config"


def test_decorator_fallback_for_chosen_reasons_only() -> None:
    def fetch(url: str) -> str:
        raise ValueError("bad")

    name = _register(fetch, fallback="late default", fallback_on=("deadline_exceeded",))
    assert _run(name).is_error is True


def test_soft_timeout_runs_the_branch_once_before_the_fallback() -> None:
    def cached(url: str) -> str:
        return "cached after timeout"

    branch = _register(cached)

    def fetch(url: str) -> str:
        raise SoftTimeLimitExceeded()

    name = _register(fetch, fail_branch=branch, fail_branch_on=("timeout_soft",), fallback="fb")
    ctx, clock = _ctx(), FakeClock()
    job = _job(name, {"url": "u"})
    with pytest.raises(SoftTimeLimitExceeded):
        run_tool(job, ctx, clock_ms=clock.ms, sleep=clock.sleep, interrupts=(SoftTimeLimitExceeded,))
    result = soft_timeout_result(job, ctx, attempt=1, clock_ms=clock.ms)
    assert result.text == "cached after timeout"
    assert result.details["branch_reason"] == "timeout_soft"
    # A second failure of the same call does not run the branch again: the fallback answers
    again = written(soft_timeout_result(job, ctx, attempt=1, clock_ms=clock.ms))
    assert (again.text, again.details["reason"]) == ("fb", "timeout_soft")


def test_branch_interrupted_by_the_soft_limit_is_not_tried_again() -> None:
    def cached(url: str) -> str:
        raise SoftTimeLimitExceeded()

    branch = _register(cached)

    def fetch(url: str) -> str:
        raise OSError("down")

    name = _register(fetch, fail_branch=branch)
    ctx, clock = _ctx(), FakeClock()
    job = _job(name, {"url": "u"})
    with pytest.raises(SoftTimeLimitExceeded):
        run_tool(job, ctx, clock_ms=clock.ms, sleep=clock.sleep, interrupts=(SoftTimeLimitExceeded,))
    result = soft_timeout_result(job, ctx, attempt=1, clock_ms=clock.ms)
    assert result.is_error is True
    assert result.reason == "timeout_soft"
    assert "answered_by" not in result.details
