"""The ``@tool`` decorator and the registry of tools, with argument schemas from signatures."""

from __future__ import annotations

import asyncio
import difflib
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

import jsonschema
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from workers.core.failure_policy import BRANCH_REASONS, FALLBACK_REASONS, BranchRule, check_reasons
from workers.core.models import RetryPolicy, SyntheticReason
from workers.errors import ConfigError, InvalidArguments, ToolNotFound
from workers.tools.context import ToolContext

__all__ = [
    "NO_FALLBACK",
    "ToolSpec",
    "get_tool",
    "register_spec",
    "registered_tools",
    "tool",
    "unregister",
    "unregister_where",
    "validate_arguments",
]

NO_FALLBACK: Any = object()

_REGISTRY: dict[str, ToolSpec] = {}

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ToolSpec:
    """A registered tool: its function, argument schema, limits and failure policy."""

    name: str
    func: Callable[..., Any]
    arguments_model: type[BaseModel]
    wants_context: bool
    soft_timeout_s: float | None = None
    hard_timeout_s: float | None = None
    heartbeat_timeout_s: float | None = None
    idempotent: bool = False
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    fallback: Any = NO_FALLBACK
    description: str = ""
    fallback_reasons: tuple[SyntheticReason, ...] = ()
    fail_branch: BranchRule | None = None
    memory_limit_mb: int | None = None
    #: An MCP upstream's tool: its JSON Schema (the call's arguments go to ``func`` as one dict).
    input_schema: dict[str, Any] | None = None
    #: An MCP upstream's tool annotations (readOnlyHint, ...), served as they came.
    annotations: dict[str, Any] | None = None
    #: A stateful MCP upstream's tool: its name, whose own queue its calls go to
    #: (``workers.core.mcp_upstreams.upstream_queue``); None: the tool queue.
    stateful_upstream: str | None = None

    @property
    def has_fallback(self) -> bool:
        """Whether a failure or timeout is answered with the declared fallback value."""
        return self.fallback is not NO_FALLBACK

    def invoke(self, arguments: Mapping[str, Any], ctx: ToolContext) -> Any:
        """Run the tool with validated ``arguments`` (async tools get their own loop)."""
        if self.input_schema is not None:
            return self.func(dict(arguments), ctx)
        kwargs = dict(arguments)
        if self.wants_context:
            kwargs["ctx"] = ctx
        result = self.func(**kwargs)
        if inspect.isawaitable(result):
            return asyncio.run(_await(result))
        return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _arguments_model(name: str, func: Callable[..., Any]) -> tuple[type[BaseModel], bool]:
    fields: dict[str, Any] = {}
    wants_context = False
    hints = inspect.get_annotations(func, eval_str=True)
    for param in inspect.signature(func).parameters.values():
        if param.name == "ctx":
            wants_context = True
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigError([(f"tool {name}", f"*{param.name} parameters cannot have a schema")])
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, default)
    config = ConfigDict(extra="forbid", arbitrary_types_allowed=False)
    model = create_model(f"{name}_arguments", __config__=config, **fields)
    return model, wants_context


def _check_limits(
    name: str, soft: float | None, hard: float | None, heartbeat: float | None, memory_mb: object
) -> None:
    problems = [
        (f"tool {name}.{label}", "must be > 0")
        for label, value in (
            ("soft_timeout_s", soft),
            ("hard_timeout_s", hard),
            ("heartbeat_timeout_s", heartbeat),
        )
        if value is not None and value <= 0
    ]
    if soft is not None and hard is not None and hard <= soft:
        problems.append((f"tool {name}.hard_timeout_s", f"must be greater than soft_timeout_s ({soft})"))
    if memory_mb is not None and (
        isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < 0
    ):
        problems.append((f"tool {name}.memory_limit_mb", "must be a whole number of MB, >= 0 (0: no limit)"))
    if problems:
        raise ConfigError(problems)


@overload
def tool(func: F) -> F: ...


@overload
def tool(
    *,
    name: str | None = None,
    soft_timeout_s: float | None = None,
    hard_timeout_s: float | None = None,
    heartbeat_timeout_s: float | None = None,
    idempotent: bool = False,
    retry: RetryPolicy | None = None,
    fallback: Any = NO_FALLBACK,
    description: str | None = None,
    fallback_on: Iterable[str] = (),
    fail_branch: str | None = None,
    fail_branch_on: Iterable[str] = ("tool_error", "timeout_soft"),
    memory_limit_mb: int | None = None,
) -> Callable[[F], F]: ...


def tool(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    soft_timeout_s: float | None = None,
    hard_timeout_s: float | None = None,
    heartbeat_timeout_s: float | None = None,
    idempotent: bool = False,
    retry: RetryPolicy | None = None,
    fallback: Any = NO_FALLBACK,
    description: str | None = None,
    fallback_on: Iterable[str] = (),
    fail_branch: str | None = None,
    fail_branch_on: Iterable[str] = ("tool_error", "timeout_soft"),
    memory_limit_mb: int | None = None,
) -> Any:
    """Register a function as a tool; usable bare (``@tool``) or with options.

    A parameter named ``ctx`` receives the :class:`ToolContext` (heartbeats); every other
    parameter becomes part of the argument schema, validated before the tool runs.

    ``fallback`` is returned as a normal result when the tool fails on the worker (for the
    reasons in ``fallback_on``, or any); ``tools.fallbacks`` in config also covers answers
    written elsewhere (deadline, lost worker, dispatch, cancel). ``fail_branch`` names a tool
    tried once with the same arguments when this one fails for ``fail_branch_on``.

    ``memory_limit_mb`` bounds the memory one call may add, the tool's and every process it
    starts (0: none); ``tools.memory_limits_mb`` in config wins over it, and without either
    ``limits.memory_limit_mb`` applies. A call past it is answered ``out_of_memory``.

    Raises:
        ConfigError: on inconsistent limits or a second tool with the same name.
    """

    def register(target: Callable[..., Any]) -> Callable[..., Any]:
        tool_name = name or target.__name__
        _check_limits(tool_name, soft_timeout_s, hard_timeout_s, heartbeat_timeout_s, memory_limit_mb)
        model, wants_context = _arguments_model(tool_name, target)
        reasons, branch = _failure_options(tool_name, fallback_on, fail_branch, fail_branch_on)
        spec = ToolSpec(
            name=tool_name,
            func=target,
            arguments_model=model,
            wants_context=wants_context,
            soft_timeout_s=soft_timeout_s,
            hard_timeout_s=hard_timeout_s,
            heartbeat_timeout_s=heartbeat_timeout_s,
            idempotent=idempotent,
            retry=retry or RetryPolicy(),
            fallback=fallback,
            description=description or (inspect.getdoc(target) or "").split("\n")[0],
            fallback_reasons=reasons,
            fail_branch=branch,
            memory_limit_mb=memory_limit_mb,
        )
        existing = _REGISTRY.get(tool_name)
        if existing is not None and _origin(existing.func) != _origin(target):
            raise ConfigError([(f"tool {tool_name}", "registered twice by different functions")])
        _REGISTRY[tool_name] = spec
        return target

    return register(func) if func is not None else register


def _failure_options(
    name: str, fallback_on: Iterable[str], fail_branch: str | None, fail_branch_on: Iterable[str]
) -> tuple[tuple[SyntheticReason, ...], BranchRule | None]:
    try:
        reasons = check_reasons(tuple(fallback_on), FALLBACK_REASONS)
        branch_reasons = check_reasons(tuple(fail_branch_on), BRANCH_REASONS)
    except ValueError as exc:
        raise ConfigError([(f"tool {name}", str(exc))]) from None
    if fail_branch == name:
        raise ConfigError([(f"tool {name}.fail_branch", "a tool cannot be its own fail-branch")])
    return reasons, (BranchRule(fail_branch, branch_reasons) if fail_branch else None)


def _origin(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


def unregister(name: str, func: Callable[..., Any]) -> None:
    """Remove tool ``name`` if ``func`` registered it (a user's tool of that name stays)."""
    existing = _REGISTRY.get(name)
    if existing is not None and _origin(existing.func) == _origin(func):
        del _REGISTRY[name]


def registered_tools() -> dict[str, ToolSpec]:
    """A snapshot of the registry."""
    return dict(_REGISTRY)


def get_tool(name: str) -> ToolSpec:
    """The tool called ``name``; raises ``ToolNotFound`` with the closest registered names."""
    spec = _REGISTRY.get(name)
    if spec is None:
        raise ToolNotFound(name, difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.4))
    return spec


def validate_arguments(spec: ToolSpec, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments checked against the tool's schema; raises ``InvalidArguments`` listing each problem."""
    if spec.input_schema is not None:
        return _validated_by_schema(spec.name, spec.input_schema, arguments)
    try:
        model = spec.arguments_model.model_validate(dict(arguments))
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in err['loc']) or '<arguments>'}: {err['msg']}" for err in exc.errors()
        ]
        raise InvalidArguments(spec.name, problems) from None
    return {name: getattr(model, name) for name in type(model).model_fields}


def _validated_by_schema(
    name: str, schema: Mapping[str, Any], arguments: Mapping[str, Any]
) -> dict[str, Any]:
    validator = jsonschema.Draft202012Validator(schema)
    problems = [
        f"{'.'.join(str(p) for p in err.absolute_path) or '<arguments>'}: {err.message}"
        for err in validator.iter_errors(dict(arguments))
    ]
    if problems:
        raise InvalidArguments(name, problems)
    return dict(arguments)


def register_spec(spec: ToolSpec) -> None:
    """Register a tool built elsewhere (an MCP upstream's), replacing one of the same name."""
    _check_limits(spec.name, spec.soft_timeout_s, spec.hard_timeout_s, None, spec.memory_limit_mb)
    _REGISTRY[spec.name] = spec


def unregister_where(keep: Callable[[ToolSpec], bool]) -> None:
    """Remove every registered tool ``keep`` says no to."""
    for name, spec in list(_REGISTRY.items()):
        if not keep(spec):
            del _REGISTRY[name]
