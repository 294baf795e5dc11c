"""The @tool decorator, argument schemas from signatures, lookup, and the loader."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any, Literal

import pytest

from workers.core.models import RetryPolicy
from workers.errors import ConfigError, InvalidArguments, ToolNotFound
from workers.tools import builtins, loader, registry
from workers.tools.context import ToolContext
from workers.tools.registry import NO_FALLBACK, get_tool, registered_tools, tool, validate_arguments

# Imported before any snapshot so that every test sees the built-ins registered.
assert builtins.MAX_OUTPUT_BYTES > 0


pytestmark = pytest.mark.usefixtures("isolated_registry")  # tests register tools of their own


def _unique(stem: str) -> str:
    return f"{stem}_{uuid.uuid4().hex[:8]}"


def _ctx(beats: list[Any] | None = None) -> ToolContext:
    return ToolContext(
        session_key="s",
        run_id="r",
        call_id="c",
        attempt=1,
        deadline_ms=0,
        clock=lambda: 0.0,
        on_heartbeat=(beats if beats is not None else []).append,
        on_process_group=lambda pgid: None,
    )


# --- registration ---------------------------------------------------------------------------


def test_bare_decorator_registers_with_defaults() -> None:
    # Given
    def bare_tool_for_test(text: str) -> str:
        """Echo the text back.

        More lines that are not the summary.
        """
        return text

    # When
    returned = tool(bare_tool_for_test)
    # Then the function is returned unchanged and registered under its own name
    assert returned is bare_tool_for_test
    spec = get_tool("bare_tool_for_test")
    assert spec.func is bare_tool_for_test
    assert spec.description == "Echo the text back."
    assert (spec.soft_timeout_s, spec.hard_timeout_s, spec.heartbeat_timeout_s) == (None, None, None)
    assert spec.idempotent is False
    assert spec.retry == RetryPolicy()
    assert spec.fallback is NO_FALLBACK
    assert not spec.has_fallback
    assert not spec.wants_context


def test_decorator_with_options() -> None:
    # Given
    name = _unique("configured")
    policy = RetryPolicy(attempts=3, retry_on=(OSError,))

    # When
    @tool(
        name=name,
        soft_timeout_s=2.0,
        hard_timeout_s=3.0,
        heartbeat_timeout_s=1.0,
        idempotent=True,
        retry=policy,
        fallback={"items": []},
        description="Explicit description.",
    )
    def anything(ctx: ToolContext, query: str) -> str:
        """Docstring that loses to the explicit description."""
        return query

    # Then
    spec = get_tool(name)
    assert spec.func is anything
    assert (spec.soft_timeout_s, spec.hard_timeout_s, spec.heartbeat_timeout_s) == (2.0, 3.0, 1.0)
    assert spec.idempotent
    assert spec.retry is policy
    assert spec.has_fallback
    assert spec.fallback == {"items": []}
    assert spec.description == "Explicit description."
    assert spec.wants_context
    assert name in registered_tools()


@pytest.mark.parametrize("fallback", [None, "", 0, False, []])
def test_falsy_fallbacks_still_count(fallback: object) -> None:
    name = _unique("falsy")
    tool(name=name, fallback=fallback)(lambda: 1)
    assert get_tool(name).has_fallback
    assert get_tool(name).fallback == fallback


def test_registered_tools_is_a_snapshot() -> None:
    snapshot = registered_tools()
    snapshot["injected"] = snapshot.get("exec")  # type: ignore[assignment]
    assert "injected" not in registered_tools()


# --- schema from the signature --------------------------------------------------------------


def _schema_tool() -> str:
    name = _unique("schema")

    @tool(name=name)
    def search(
        ctx: ToolContext,
        query: str,
        limit: int = 10,
        mode: Literal["fast", "deep"] = "fast",
        tags: list[str] | None = None,
        ratio: float = 0.5,
    ) -> dict[str, Any]:
        return {"query": query, "limit": limit, "mode": mode, "tags": tags, "ratio": ratio}

    return name


def test_schema_is_derived_from_the_signature() -> None:
    # Given
    spec = get_tool(_schema_tool())
    # When
    schema = spec.arguments_model.model_json_schema()
    # Then
    assert set(schema["properties"]) == {"query", "limit", "mode", "tags", "ratio"}
    assert schema["required"] == ["query"]
    assert schema["properties"]["query"]["type"] == "string"
    assert schema["properties"]["limit"] == {"default": 10, "title": "Limit", "type": "integer"}
    assert schema["properties"]["mode"]["enum"] == ["fast", "deep"]
    assert schema["properties"]["ratio"]["type"] == "number"
    assert schema["additionalProperties"] is False


def test_ctx_is_not_part_of_the_schema() -> None:
    spec = get_tool(_schema_tool())
    assert "ctx" not in spec.arguments_model.model_fields
    assert spec.wants_context


def test_unannotated_parameters_accept_anything() -> None:
    name = _unique("loose")

    @tool(name=name)
    def loose(value, other=3):
        return value

    spec = get_tool(name)
    assert validate_arguments(spec, {"value": {"any": ["thing"]}}) == {
        "value": {"any": ["thing"]},
        "other": 3,
    }


def test_valid_arguments_get_defaults_filled_in() -> None:
    spec = get_tool(_schema_tool())
    assert validate_arguments(spec, {"query": "q"}) == {
        "query": "q",
        "limit": 10,
        "mode": "fast",
        "tags": None,
        "ratio": 0.5,
    }


@pytest.mark.parametrize(
    ("arguments", "expected_problem_fields"),
    [
        ({}, ["query"]),
        ({"query": 5}, ["query"]),
        ({"query": "q", "limit": "many"}, ["limit"]),
        ({"query": "q", "mode": "slow"}, ["mode"]),
        ({"query": "q", "tags": "not-a-list"}, ["tags"]),
        ({"query": "q", "tags": ["ok", 3]}, ["tags.1"]),
        ({"limit": "many", "mode": "slow"}, ["query", "limit", "mode"]),  # every problem, not the first
        ({"query": "q", "surprise": 1}, ["surprise"]),  # extra arguments are refused
        ({"query": "q", "ctx": "forged"}, ["ctx"]),  # the context cannot be passed in
    ],
)
def test_invalid_arguments_list_each_problem_with_its_field(
    arguments: dict[str, Any], expected_problem_fields: list[str]
) -> None:
    # Given
    spec = get_tool(_schema_tool())
    # When
    with pytest.raises(InvalidArguments) as info:
        validate_arguments(spec, arguments)
    # Then
    error = info.value
    assert error.tool == spec.name
    assert [problem.split(":")[0] for problem in error.problems] == expected_problem_fields
    assert all(problem.split(": ", 1)[1] for problem in error.problems)
    for problem in error.problems:
        assert problem in str(error)


def test_extra_argument_problem_says_why() -> None:
    spec = get_tool(_schema_tool())
    with pytest.raises(InvalidArguments) as info:
        validate_arguments(spec, {"query": "q", "surprise": 1})
    assert info.value.problems == ["surprise: Extra inputs are not permitted"]


def test_variadic_parameters_cannot_have_a_schema() -> None:
    with pytest.raises(ConfigError, match=r"\*args"):

        @tool(name=_unique("variadic"))
        def variadic(*args: int) -> None:
            return None


# --- lookup ---------------------------------------------------------------------------------


def test_unknown_tool_names_the_closest_registered_ones() -> None:
    # Given
    tool(name="weather_lookup_zq")(lambda city: city)
    tool(name="weather_forecast_zq")(lambda city: city)
    # When
    with pytest.raises(ToolNotFound) as info:
        get_tool("weather_lookpu_zq")
    # Then
    assert info.value.name == "weather_lookpu_zq"
    assert info.value.closest[0] == "weather_lookup_zq"
    assert "weather_forecast_zq" in info.value.closest
    assert len(info.value.closest) <= 3


def test_unknown_tool_with_nothing_close() -> None:
    with pytest.raises(ToolNotFound) as info:
        get_tool("zzzzzzzzzzzzzzzzzzzzzzzz")
    assert info.value.closest == []


# --- limits ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "bad_key"),
    [
        ({"soft_timeout_s": 5.0, "hard_timeout_s": 5.0}, "hard_timeout_s"),  # equal is refused
        ({"soft_timeout_s": 5.0, "hard_timeout_s": 4.0}, "hard_timeout_s"),
        ({"soft_timeout_s": 0.0}, "soft_timeout_s"),
        ({"soft_timeout_s": -1.0}, "soft_timeout_s"),
        ({"hard_timeout_s": 0.0}, "hard_timeout_s"),
        ({"heartbeat_timeout_s": -0.5}, "heartbeat_timeout_s"),
    ],
)
def test_inconsistent_limits_are_refused(options: dict[str, float], bad_key: str) -> None:
    # Given
    name = _unique("limits")
    # When
    with pytest.raises(ConfigError) as info:
        tool(name=name, **options)(lambda: None)  # type: ignore[call-overload]
    # Then
    assert any(path == f"tool {name}.{bad_key}" for path, _ in info.value.problems), info.value.problems
    assert name not in registered_tools()


def test_soft_below_hard_is_fine() -> None:
    name = _unique("limits")
    tool(name=name, soft_timeout_s=1.0, hard_timeout_s=1.5)(lambda: None)
    assert get_tool(name).hard_timeout_s == 1.5


# --- invocation -----------------------------------------------------------------------------


def test_sync_tool_gets_the_context() -> None:
    # Given
    name = _unique("beating")

    @tool(name=name)
    def beating(ctx: ToolContext, steps: int) -> int:
        for step in range(steps):
            ctx.heartbeat({"step": step})
        return steps

    beats: list[Any] = []
    # When
    result = get_tool(name).invoke({"steps": 1}, _ctx(beats))
    # Then
    assert result == 1
    assert beats == [{"step": 0}]


def test_async_tools_run() -> None:
    name = _unique("async")

    @tool(name=name)
    async def doubled(value: int) -> int:
        return value * 2

    spec = get_tool(name)
    assert spec.invoke(validate_arguments(spec, {"value": 21}), _ctx()) == 42


def test_async_tool_errors_propagate() -> None:
    name = _unique("async_fail")

    @tool(name=name)
    async def failing() -> None:
        raise ValueError("inside the loop")

    with pytest.raises(ValueError, match="inside the loop"):
        get_tool(name).invoke({}, _ctx())


# --- duplicates -----------------------------------------------------------------------------


def test_a_second_different_function_with_the_same_name_is_refused() -> None:
    # Given
    name = _unique("dup")

    @tool(name=name)
    def first() -> int:
        return 1

    # When / Then
    with pytest.raises(ConfigError, match="registered twice"):

        @tool(name=name)
        def second() -> int:
            return 2

    assert get_tool(name).func is first


def test_re_registering_the_same_function_is_allowed() -> None:
    # A module imported twice (reload, entry point + UNSTUCK_TOOL_MODULES) registers again.
    name = _unique("again")

    def same() -> int:
        return 1

    tool(name=name)(same)
    tool(name=name)(same)
    assert get_tool(name).func is same


def test_same_named_functions_from_two_modules_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two plugin modules that both define a top-level `lookup` tool
    name = _unique("lookup")
    for module in ("plugin_one_zq", "plugin_two_zq"):
        (tmp_path / f"{module}.py").write_text(
            "from workers.tools import tool\n\n"
            f"@tool(name={name!r})\n"
            "def lookup(key: str) -> str:\n"
            f"    return {module!r}\n",
            encoding="utf-8",
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "plugin_one_zq", raising=False)
    monkeypatch.delitem(sys.modules, "plugin_two_zq", raising=False)
    # When / Then
    import importlib

    importlib.import_module("plugin_one_zq")
    try:
        with pytest.raises(ConfigError, match="registered twice"):
            importlib.import_module("plugin_two_zq")
    finally:
        sys.modules.pop("plugin_one_zq", None)
        sys.modules.pop("plugin_two_zq", None)


# --- loader ---------------------------------------------------------------------------------


def test_load_tools_registers_no_builtins_by_default() -> None:
    tools = loader.load_tools([], use_entry_points=False)
    assert not {"exec", "http_fetch"} & set(tools)


def test_load_tools_registers_only_the_enabled_builtins_and_unregisters_the_others() -> None:
    # Given both built-ins enabled
    assert {"exec", "http_fetch"} <= set(loader.load_tools([], builtins=["exec", "http_fetch"]))
    # When loaded again with only http_fetch (the registry follows the latest settings)
    tools = loader.load_tools([], builtins=["http_fetch"], use_entry_points=False)
    # Then exec is gone, from the returned snapshot and from the registry
    assert "http_fetch" in tools
    assert "exec" not in tools
    assert "exec" not in registered_tools()
    loader.load_tools([], use_entry_points=False)
    assert "http_fetch" not in registered_tools()


def test_unknown_builtin_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="shell"):
        loader.load_tools([], builtins=["shell"], use_entry_points=False)


def test_disabling_a_builtin_keeps_a_user_tool_of_the_same_name() -> None:
    # Given no built-in registered (an in-process gateway of an earlier test may have enabled
    # them) and a user tool named like a built-in
    loader.load_tools([], use_entry_points=False)

    @tool(name="http_fetch")
    def my_fetch(url: str) -> str:
        return url

    try:
        # When the built-ins are loaded disabled
        loader.load_tools([], use_entry_points=False)
        # Then the user's tool stays
        assert registered_tools()["http_fetch"].func is my_fetch
    finally:
        registry._REGISTRY.pop("http_fetch", None)


def test_load_tools_imports_configured_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given
    name = _unique("from_module")
    (tmp_path / "my_tools_zq.py").write_text(
        f"from workers.tools import tool\n\n@tool(name={name!r})\ndef t() -> int:\n    return 1\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_tools_zq", raising=False)
    # When
    try:
        tools = loader.load_tools(["my_tools_zq"], use_entry_points=False)
    finally:
        sys.modules.pop("my_tools_zq", None)
    # Then
    assert name in tools


def test_missing_tool_module_is_a_config_error_naming_it() -> None:
    # When
    with pytest.raises(ConfigError) as info:
        loader.load_tools(["no_such_module_zq.tools", "also_missing_zq"], use_entry_points=False)
    # Then every broken module is named
    message = str(info.value)
    assert "UNSTUCK_TOOL_MODULES: no_such_module_zq.tools" in message
    assert "UNSTUCK_TOOL_MODULES: also_missing_zq" in message
    assert "ModuleNotFoundError" in message


def test_tool_module_failing_on_import_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_tools_zq.py").write_text(
        "raise ValueError('half-written plugin')\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"broken_tools_zq.*ValueError: half-written plugin"):
        loader.load_tools(["broken_tools_zq"], use_entry_points=False)
    sys.modules.pop("broken_tools_zq", None)


def test_memory_limit_is_declared_on_the_decorator() -> None:
    name = _unique("big")

    @tool(name=name, memory_limit_mb=512)
    def big() -> str:
        return "ok"

    assert get_tool(name).memory_limit_mb == 512


@pytest.mark.parametrize("bad", [-1, 1.5, True, "256"])
def test_a_memory_limit_that_is_no_whole_mb_is_refused(bad: Any) -> None:
    with pytest.raises(ConfigError, match="memory_limit_mb"):

        @tool(name=_unique("bad"), memory_limit_mb=bad)
        def bad_tool() -> str:
            return "never"


def test_builtins_declare_memory_limits() -> None:
    builtins.enable_builtins(["exec", "http_fetch"])
    try:
        assert get_tool("exec").memory_limit_mb == 2048
        assert get_tool("http_fetch").memory_limit_mb == 256
    finally:
        builtins.enable_builtins([])
