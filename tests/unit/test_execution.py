"""run_tool: validation, retries inside the budget, fallbacks, interrupts, and interrupted results."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from billiard.exceptions import SoftTimeLimitExceeded

from workers.answering.service import Answers
from workers.core.failure_policy import NO_RULES, FailureRules
from workers.core.memory_limits import OomCause
from workers.core.models import CallJob, RetryPolicy, SyntheticReason, ToolCall, ToolResult
from workers.errors import ToolExecutionError
from workers.tools.context import ToolContext
from workers.tools.registry import registered_tools, tool
from workers.worker.branching import declared_fallbacks
from workers.worker.execution import interrupted_result, memory_exceeded_result, run_tool

SUBMITTED_MS = 1_000_000


pytestmark = pytest.mark.usefixtures("isolated_registry")  # tests register tools of their own


class FakeClock:
    """A millisecond clock that only moves when the code under test sleeps (or a tool spends time)."""

    def __init__(self, now_ms: int = SUBMITTED_MS + 40) -> None:
        self.now = now_ms
        self.sleeps: list[float] = []

    def ms(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += int(seconds * 1000)


def _job(name: str, arguments: dict[str, Any] | None = None, **changes: Any) -> CallJob:
    fields: dict[str, Any] = {
        "session_key": "s1",
        "run_id": "r1",
        "call": ToolCall(id="c1", name=name, arguments=arguments or {}),
        "submitted_ms": SUBMITTED_MS,
        "deadline_ms": SUBMITTED_MS + 20_000,
        "soft_s": 10.0,
        "hard_s": 15.0,
    }
    fields.update(changes)
    return CallJob(**fields)


def _ctx() -> ToolContext:
    return ToolContext(
        session_key="s1",
        run_id="r1",
        call_id="c1",
        attempt=1,
        deadline_ms=SUBMITTED_MS + 20_000,
        clock=lambda: 0.0,
        on_heartbeat=lambda details: None,
        on_process_group=lambda pgid: None,
    )


def _register(func: Any, **options: Any) -> str:
    name = f"{func.__name__}_{uuid.uuid4().hex[:8]}"
    tool(name=name, **options)(func)
    return name


def _run(job: CallJob, clock: FakeClock | None = None, **kwargs: Any) -> Any:
    clock = clock or FakeClock()
    return run_tool(job, _ctx(), clock_ms=clock.ms, sleep=clock.sleep, **kwargs)


def written(result: ToolResult, rules: FailureRules = NO_RULES) -> ToolResult:
    """What the worker writes for ``result``: its answering service adds the fallbacks (config, decorator)."""
    declared = declared_fallbacks(registered_tools())
    return Answers(writer="w", fallbacks=rules.fallbacks, declared=declared).given(result)


# --- success and errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("plain text", "plain text"),
        ({"b": 1, "a": [1, 2]}, '{"a": [1, 2], "b": 1}'),
        (None, "null"),
        (3, "3"),
    ],
)
def test_success_becomes_a_success_result(value: object, text: str) -> None:
    # Given
    def returns() -> object:
        return value

    name = _register(returns)
    clock = FakeClock(SUBMITTED_MS + 75)
    # When
    result = _run(_job(name), clock)
    # Then
    assert not result.is_error
    assert result.text == text
    assert result.details == {"synthetic": False, "elapsed_ms": 75, "attempt": 1}
    assert (result.tool_call_id, result.tool_name) == ("c1", name)
    assert clock.sleeps == []


def test_arguments_are_validated_and_passed() -> None:
    def add(a: int, b: int = 2) -> int:
        return a + b

    result = _run(_job(_register(add), {"a": 40}))
    assert result.text == "42"


@pytest.mark.parametrize(
    ("error", "error_type", "message"),
    [
        (ValueError("bad value"), "ValueError", "bad value"),
        (KeyError("missing"), "KeyError", "'missing'"),
        (ToolExecutionError("remote said no"), "ToolExecutionError", "remote said no"),
        (ZeroDivisionError("division by zero"), "ZeroDivisionError", "division by zero"),
    ],
)
def test_exception_becomes_an_error_result_with_type_and_message(
    error: Exception, error_type: str, message: str
) -> None:
    # Given
    def fails() -> None:
        raise error

    # When
    result = _run(_job(_register(fails)))
    # Then
    assert result.is_error
    assert f"{error_type}: {message}" in result.text
    assert "Traceback" not in result.text
    assert 'File "' not in result.text
    assert result.details["error_type"] == error_type
    assert result.details["reason"] == SyntheticReason.TOOL_ERROR.value
    assert result.details["synthetic"] is False
    assert result.details["attempt"] == 1


# --- retries --------------------------------------------------------------------------------------


class Flaky(Exception):
    pass


@pytest.mark.parametrize(
    ("failures", "error", "expected_text", "expected_attempts", "expected_sleeps"),
    [
        (0, Flaky("x"), "ok after 1", 1, []),
        (1, Flaky("x"), "ok after 2", 2, [0.5]),
        (2, Flaky("x"), "ok after 3", 3, [0.5, 1.0]),
        (3, Flaky("x"), "Flaky: x", 3, [0.5, 1.0]),  # out of attempts: the last error
        (2, ToolExecutionError("503", retryable=True), "ok after 3", 3, [0.5, 1.0]),
        (2, ToolExecutionError("404", retryable=False), "ToolExecutionError: 404", 1, []),
        (2, ValueError("not listed"), "ValueError: not listed", 1, []),
    ],
)
def test_retries_within_attempts(
    failures: int, error: Exception, expected_text: str, expected_attempts: int, expected_sleeps: list[float]
) -> None:
    # Given
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) <= failures:
            raise error
        return f"ok after {len(calls)}"

    name = _register(flaky, retry=RetryPolicy(attempts=3, backoff_s=0.5, multiplier=2.0, retry_on=(Flaky,)))
    clock = FakeClock()
    # When
    result = _run(_job(name), clock)
    # Then
    assert expected_text in result.text
    assert result.details["attempt"] == expected_attempts
    assert len(calls) == expected_attempts
    assert clock.sleeps == expected_sleeps


@pytest.mark.parametrize(
    ("soft_s", "expected_sleeps"),
    [
        (10.0, [0.5, 1.0, 2.0, 4.0]),  # 7.5 s slept; the next 8 s would pass 10 s
        (3.6, [0.5, 1.0, 2.0]),  # 0.5 + 1.0 + 2.0 = 3.5 s < 3.6 s
        (3.5, [0.5, 1.0]),  # the third backoff would end exactly at the soft limit: not < it
        (0.6, [0.5]),
        (0.5, []),  # even the first backoff does not fit
    ],
)
def test_retries_stop_when_the_backoff_would_pass_the_soft_limit(
    soft_s: float, expected_sleeps: list[float]
) -> None:
    # Given a tool that always fails with a retryable error
    def always_fails() -> None:
        raise ToolExecutionError("flaky upstream", retryable=True)

    name = _register(always_fails, retry=RetryPolicy(attempts=10, backoff_s=0.5, multiplier=2.0))
    clock = FakeClock()
    # When
    result = _run(_job(name, soft_s=soft_s, hard_s=soft_s + 5), clock)
    # Then
    assert clock.sleeps == expected_sleeps
    assert result.is_error
    assert result.details["attempt"] == len(expected_sleeps) + 1


def test_elapsed_counts_from_submission_across_retries() -> None:
    def always_fails() -> None:
        raise Flaky("again")

    name = _register(always_fails, retry=RetryPolicy(attempts=2, backoff_s=1.0, retry_on=(Flaky,)))
    clock = FakeClock(SUBMITTED_MS + 100)
    result = _run(_job(name), clock)
    assert result.details["elapsed_ms"] == 1_100


# --- fallback -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fallback", [{"results": []}, "no data", None])
def test_fallback_answers_a_failure_as_a_normal_result(fallback: object) -> None:
    # Given
    def fails() -> None:
        raise ConnectionError("upstream down")

    name = _register(fails, fallback=fallback)
    # When
    raw = _run(_job(name))
    result = written(raw)
    # Then the tool's run returns the failure; the answer written is the fallback
    assert raw.is_error
    assert not result.is_error
    assert result.details["fallback"] is True
    assert result.details["synthetic"] is True
    assert result.details["reason"] == SyntheticReason.TOOL_ERROR.value
    assert "upstream down" not in result.text


def test_fallback_only_after_retries_are_spent() -> None:
    calls: list[int] = []

    def fails() -> None:
        calls.append(1)
        raise Flaky("x")

    name = _register(fails, fallback="fb", retry=RetryPolicy(attempts=3, backoff_s=0.0, retry_on=(Flaky,)))
    result = written(_run(_job(name)))
    assert (result.text, result.details["attempt"], len(calls)) == ("fb", 3, 3)


# --- calls that must not run ----------------------------------------------------------------------


def test_unknown_tool_is_rejected_with_closest_names() -> None:
    # Given
    _register(lambda: None)  # noise
    tool(name="summarize_zq")(lambda text: text)
    # When
    result = _run(_job("sumarize_zq"))
    # Then
    assert result.is_error
    assert result.reason == SyntheticReason.UNKNOWN_TOOL.value
    assert result.details["attempt"] == 0
    assert "sumarize_zq" in result.text
    assert "closest: summarize_zq" in result.text


def test_unknown_tool_without_close_names_says_so_plainly() -> None:
    result = _run(_job("qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq"))
    assert result.reason == SyntheticReason.UNKNOWN_TOOL.value
    assert "closest" not in result.text


def test_invalid_arguments_are_rejected_listing_each_problem() -> None:
    # Given
    ran: list[int] = []

    def strict(count: int, label: str) -> None:
        ran.append(count)

    name = _register(strict)
    clock = FakeClock(SUBMITTED_MS + 7)
    # When
    result = _run(_job(name, {"count": "many", "extra": True}), clock)
    # Then
    assert ran == []
    assert result.is_error
    assert result.reason == SyntheticReason.INVALID_ARGUMENTS.value
    assert result.details["attempt"] == 0
    assert result.details["elapsed_ms"] == 7
    problems = result.details["problems"]
    assert [p.split(":")[0] for p in problems] == ["count", "label", "extra"]
    for problem in problems:
        assert problem in result.text


# --- interrupts -----------------------------------------------------------------------------------


class MyInterrupt(Exception):
    # Like billiard's SoftTimeLimitExceeded, it derives from Exception.
    pass


@pytest.mark.parametrize("interrupt", [MyInterrupt, SoftTimeLimitExceeded])
def test_interrupts_deriving_from_exception_propagate(interrupt: type[Exception]) -> None:
    # Given a tool stopped by the pool's soft limit, with a fallback and a retry policy that would
    # otherwise swallow the exception
    def hung() -> None:
        raise interrupt()

    name = _register(hung, fallback="fb", retry=RetryPolicy(attempts=3, retry_on=(Exception,)))
    clock = FakeClock()
    # When / Then
    with pytest.raises(interrupt):
        _run(_job(name), clock, interrupts=(interrupt,))
    assert clock.sleeps == []


def test_without_declaring_it_an_interrupt_would_become_an_error_result() -> None:
    # This is the trap the ``interrupts`` parameter exists for.
    def hung() -> None:
        raise MyInterrupt("soft limit")

    result = _run(_job(_register(hung)))
    assert result.is_error
    assert "MyInterrupt" in result.text


def test_interrupt_on_a_retry_still_propagates() -> None:
    attempts: list[int] = []

    def flaky_then_hung() -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise Flaky("first")
        raise MyInterrupt()

    name = _register(flaky_then_hung, retry=RetryPolicy(attempts=3, backoff_s=0.1, retry_on=(Flaky,)))
    with pytest.raises(MyInterrupt):
        _run(_job(name), interrupts=(MyInterrupt,))
    assert len(attempts) == 2


@pytest.mark.parametrize("stop", [SystemExit, KeyboardInterrupt])
def test_base_exception_interrupts_propagate_without_declaring_them(stop: type[BaseException]) -> None:
    def silent() -> None:
        raise stop()

    with pytest.raises(stop):
        _run(_job(_register(silent, fallback="fb")))


# --- interrupted_result ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "limit_text"),
    [
        (SyntheticReason.TIMEOUT_SOFT, "2.5s"),
        (SyntheticReason.TIMEOUT_HARD, "4s"),
        (SyntheticReason.HEARTBEAT_TIMEOUT, "1.5s"),
        (SyntheticReason.DEADLINE_EXCEEDED, "did not finish before its deadline. "),  # no limit to name
    ],
)
def test_interrupted_result_maps_the_reason_to_its_limit(reason: SyntheticReason, limit_text: str) -> None:
    # Given
    name = _register(lambda: None)
    job = _job(name, soft_s=2.5, hard_s=4.0, heartbeat_s=1.5)
    # When
    result = interrupted_result(job, reason, elapsed_ms=2_600, attempt=1)
    # Then
    assert result.is_error
    assert result.details == {"synthetic": True, "reason": reason.value, "elapsed_ms": 2_600, "attempt": 1}
    assert limit_text in result.text
    assert "its limit" not in result.text  # never "its deadline of its limit"


@pytest.mark.parametrize("reason", [SyntheticReason.TIMEOUT_SOFT, SyntheticReason.HEARTBEAT_TIMEOUT])
def test_interrupted_result_uses_the_fallback(reason: SyntheticReason) -> None:
    name = _register(lambda: None, fallback={"partial": True})
    result = written(interrupted_result(_job(name), reason, elapsed_ms=10, attempt=2))
    assert not result.is_error
    assert result.text == '{"partial": true}'
    assert result.details["fallback"] is True
    assert result.details["reason"] == reason.value
    assert result.details["attempt"] == 2


def test_interrupted_result_without_a_spec() -> None:
    # The tool may not even be loadable in the process writing the answer.
    result = written(
        interrupted_result(_job("gone"), SyntheticReason.TIMEOUT_HARD, elapsed_ms=15_000, attempt=1)
    )
    assert result.is_error
    assert result.reason == SyntheticReason.TIMEOUT_HARD.value
    assert "15s" in result.text


def test_memory_error_is_never_retried_and_reaches_the_caller() -> None:
    # Given a tool that runs out of memory, with a policy retrying every failure
    calls: list[int] = []

    def hungry() -> str:
        calls.append(1)
        raise MemoryError

    name = _register(hungry, retry=RetryPolicy(attempts=3, backoff_s=0.5, retry_on_names=("Exception",)))
    # When / Then: the caller answers it out_of_memory once the call's limit is lifted
    with pytest.raises(MemoryError):
        _run(_job(name), FakeClock())
    assert len(calls) == 1


def test_out_of_memory_takes_the_tools_fallback_and_names_the_limit() -> None:
    def table() -> str:
        return "never"

    name = _register(table, fallback={"rows": []})
    job = _job(name)
    answered = written(
        memory_exceeded_result(job, OomCause.ALLOCATION_REFUSED, limit_mb=256, elapsed_ms=5, attempt=1)
    )
    assert (answered.is_error, answered.text, answered.reason) == (False, '{"rows": []}', "out_of_memory")
    killed = interrupted_result(
        _job("no_such_tool"),
        SyntheticReason.OUT_OF_MEMORY,
        elapsed_ms=9,
        attempt=1,
        memory_limit_mb=128,
    )
    assert killed.reason == "out_of_memory"
    assert "(its limit is 128 MB)" in killed.text
    assert "the kernel killed its process" in killed.text
