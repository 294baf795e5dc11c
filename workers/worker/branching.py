"""The worker's half of fail-branches and fallbacks: what a failed call becomes (no Celery here).

A call that failed for a reason its fail-branch covers runs the branch tool once, with the
same arguments and context, inside what is left of the call's own limits (the task's soft
and hard limits still apply: a branch cannot outlive the call). The branch's outcome is the
call's one result, naming the branch. The fallback, if one covers what is left, is applied by
the answering service when the worker writes the answer (:func:`declared_fallbacks`).

Rules: config (``tools.failBranch``/``tools.fallbacks``) wins over the decorator's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from workers.answering.rules import FallbackLookup
from workers.core.failure_policy import BranchRule, FailureRules, FallbackRule, branch_answer
from workers.core.models import CallJob, ToolResult
from workers.core.redact import redact
from workers.core.results import success_result, tool_error_result
from workers.errors import InvalidArguments, ToolNotFound
from workers.tools.context import ToolContext
from workers.tools.registry import ToolSpec, get_tool, validate_arguments

__all__ = ["branch_rule", "declared_fallbacks", "settle_failure"]


def declared_fallbacks(tools: Mapping[str, ToolSpec]) -> FallbackLookup:
    """The fallbacks ``tools`` declare in their decorators (config's ``tools.fallbacks`` win over them).

    Given to the worker's answering service, which applies them when it writes the answer.
    """

    def declared(tool: str) -> FallbackRule | None:
        spec = tools.get(tool)
        return FallbackRule(spec.fallback, spec.fallback_reasons) if spec and spec.has_fallback else None

    return declared


def branch_rule(spec: ToolSpec | None, rules: FailureRules, tool: str) -> BranchRule | None:
    """The fail-branch of ``tool``: from config, else from its decorator, else none."""
    return rules.branches.get(tool) or (spec.fail_branch if spec is not None else None)


def settle_failure(
    job: CallJob,
    ctx: ToolContext,
    spec: ToolSpec | None,
    failure: ToolResult,
    *,
    rules: FailureRules,
    clock_ms: Callable[[], int],
    interrupts: tuple[type[BaseException], ...] = (),
    allows: Callable[[str], bool] = lambda _tool: True,
) -> ToolResult:
    """``failure`` answered by the fail-branch (once per call), as configured.

    Its fallback comes when the answer is written (:func:`declared_fallbacks`).

    ``allows`` is the agent's tool policy: a branch the agent may not call is skipped, so a
    fail-branch never opens a way around ``tools.allow``/``deny``.
    """
    result = failure
    branch = branch_rule(spec, rules, job.call.name)
    if branch is not None and branch.covers(failure.reason) and not ctx.fail_branch_tried:
        ctx.fail_branch_tried = True
        if allows(branch.tool):
            result = _run_branch(job, ctx, failure, branch.tool, clock_ms=clock_ms, interrupts=interrupts)
        else:
            result = _skipped(failure, f"{branch.tool}: not allowed for this agent")
    return result


def _skipped(failure: ToolResult, why: str) -> ToolResult:
    return failure.model_copy(update={"details": {**failure.details, "branch_skipped": why}})


def _run_branch(
    job: CallJob,
    ctx: ToolContext,
    failure: ToolResult,
    tool: str,
    *,
    clock_ms: Callable[[], int],
    interrupts: tuple[type[BaseException], ...],
) -> ToolResult:
    try:
        spec = get_tool(tool)
        arguments = validate_arguments(spec, job.call.arguments)
    except (ToolNotFound, InvalidArguments) as exc:
        # The branch cannot take this call: the first failure stands, saying why no branch ran.
        return _skipped(failure, f"{tool}: {type(exc).__name__}")
    attempt = int(failure.details.get("attempt", 1))
    try:
        value = spec.invoke(arguments, ctx)
        second = success_result(job.call, value, elapsed_ms=clock_ms() - job.submitted_ms, attempt=attempt)
    except interrupts:
        raise
    except Exception as exc:  # noqa: BLE001 - a failing branch is an answer too
        second = tool_error_result(
            job.call, type(exc).__name__, str(exc), elapsed_ms=clock_ms() - job.submitted_ms, attempt=attempt
        )
    answer = branch_answer(failure, second, tool)
    # bounded_result masks secrets in the text only: the first error rides in the details.
    masked = redact(str(answer.details["first_error"]))
    return answer.model_copy(update={"details": {**answer.details, "first_error": masked}})
