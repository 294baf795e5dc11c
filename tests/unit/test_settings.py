"""Settings: defaults, environment, the OpenClaw-shaped config file, and their precedence."""

from __future__ import annotations

import json
import os
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from workers.errors import ConfigError
from workers.settings import AgentsSettings, Settings, load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's shell (or another test) must not leak UNSTUCK_* into these tests.
    for name in list(os.environ):
        if name.upper().startswith("UNSTUCK_"):
            monkeypatch.delenv(name)


def _write(tmp_path: Path, data: dict[str, Any] | str, name: str = "unstuck.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return str(path)


def _config_error(**overrides: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_settings(**overrides)
    return info.value


# --- defaults -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("agents.defaults.run_timeout_s", 1800.0),
        ("agents.defaults.llm.idle_timeout_s", 90.0),
        ("agents.defaults.tools.timeout_s", 300.0),
        ("lease.ttl_s", 4.0),
        ("gateway.grace_s", 2.0),
        ("redis.key_prefix", "unstuck"),
        ("worker.pool", "prefork"),
        ("tool_modules", ()),
    ],
)
def test_defaults(path: str, expected: object) -> None:
    # Given no environment and no config file / When
    settings = load_settings()
    # Then
    value: Any = settings
    for part in path.split("."):
        value = getattr(value, part)
    assert value == expected


def test_settings_are_frozen() -> None:
    settings = load_settings()
    with pytest.raises(ValueError, match="frozen"):
        settings.config = "x"  # type: ignore[misc]


# --- environment ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "value", "path", "expected"),
    [
        ("UNSTUCK_LEASE__TTL_S", "20", "lease.ttl_s", 20.0),
        ("UNSTUCK_GATEWAY__GRACE_S", "0.5", "gateway.grace_s", 0.5),
        ("UNSTUCK_REDIS__URL", "redis://h:1/0", "redis.url", "redis://h:1/0"),
        ("UNSTUCK_AGENTS__DEFAULTS__RUN_TIMEOUT_S", "60", "agents.defaults.run_timeout_s", 60.0),
        ("UNSTUCK_AGENTS__DEFAULTS__LLM__IDLE_TIMEOUT_S", "12", "agents.defaults.llm.idle_timeout_s", 12.0),
        ("UNSTUCK_TOOLS__TIMEOUTS_S", '{"exec": 9}', "tools.timeouts_s", {"exec": 9.0}),
        ("UNSTUCK_WORKER__CONCURRENCY", "7", "worker.concurrency", 7),
    ],
)
def test_environment_overrides_with_prefix_and_nesting(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, path: str, expected: object
) -> None:
    # Given
    monkeypatch.setenv(env, value)
    # When
    settings = load_settings()
    # Then
    found: Any = settings
    for part in path.split("."):
        found = getattr(found, part)
    assert found == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("a.tools", ("a.tools",)),
        ("a.tools,b.more", ("a.tools", "b.more")),
        (" a.tools , b.more ,, ", ("a.tools", "b.more")),
        ("", ()),
    ],
)
def test_tool_modules_are_comma_separated(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: tuple[str, ...]
) -> None:
    monkeypatch.setenv("UNSTUCK_TOOL_MODULES", raw)
    assert load_settings().tool_modules == expected


def test_unprefixed_environment_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASE__TTL_S", "3")
    assert load_settings().lease.ttl_s == 4.0


def test_invalid_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNSTUCK_LEASE__TTL_S", "soon")
    message = str(_config_error())
    assert "lease.ttl_s" in message
    assert "UNSTUCK_LEASE__TTL_S" in message


# --- config file ----------------------------------------------------------------------------------

REFERENCE: dict[str, Any] = {
    "agents": {
        "defaults": {
            "timeoutSeconds": 600,
            "llm": {"idleTimeoutSeconds": 45},
            "tools": {"timeoutSeconds": 120},
        },
        "list": [
            {"id": "main"},
            {"id": "coder", "timeoutSeconds": 3600},
            {"id": "chatty", "llm": {"idleTimeoutSeconds": 10}},
            {"id": "slowtools", "tools": {"timeoutSeconds": 900}},
        ],
    },
    "tools": {"timeouts": {"exec": 30, "http_fetch": 15.5}},
    "unstuck": {"lease": {"ttl_s": 6, "renew_interval_s": 1}, "redis": {"key_prefix": "ref"}},
    "channels": {"telegram": {"token": "ignored"}},
    "models": [{"anything": True}],
}

REFERENCE_TOML = """
[agents.defaults]
timeoutSeconds = 600
llm = { idleTimeoutSeconds = 45 }
tools = { timeoutSeconds = 120 }

[[agents.list]]
id = "main"

[[agents.list]]
id = "coder"
timeoutSeconds = 3600

[[agents.list]]
id = "chatty"
llm = { idleTimeoutSeconds = 10 }

[[agents.list]]
id = "slowtools"
tools = { timeoutSeconds = 900 }

[tools.timeouts]
exec = 30
http_fetch = 15.5

[unstuck.lease]
ttl_s = 6
renew_interval_s = 1

[unstuck.redis]
key_prefix = "ref"

[channels.telegram]
token = "ignored"
"""


@pytest.fixture(params=["json", "toml"])
def reference_file(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "json":
        return _write(tmp_path, REFERENCE, "unstuck.json")
    return _write(tmp_path, REFERENCE_TOML, "unstuck.toml")


def test_config_file_blocks_are_read(reference_file: str) -> None:
    # When
    settings = load_settings(config=reference_file)
    # Then
    assert settings.agents.defaults.run_timeout_s == 600
    assert settings.agents.defaults.llm.idle_timeout_s == 45
    assert settings.agents.defaults.tools.timeout_s == 120
    assert settings.tools.timeouts_s == {"exec": 30, "http_fetch": 15.5}
    assert settings.lease.ttl_s == 6
    assert settings.lease.renew_interval_s == 1
    assert settings.redis.key_prefix == "ref"


@pytest.mark.parametrize(
    ("agent", "run_s", "idle_s", "tool_s"),
    [
        ("main", 600, 45, 120),  # listed, overrides nothing
        ("nobody", 600, 45, 120),  # not listed: the defaults
        ("coder", 3600, 45, 120),
        ("chatty", 600, 10, 120),
        ("slowtools", 600, 45, 900),
    ],
)
def test_agent_entries_override_defaults_field_by_field(
    reference_file: str, agent: str, run_s: float, idle_s: float, tool_s: float
) -> None:
    # Given
    settings = load_settings(config=reference_file)
    # When
    profile = settings.agents.for_agent(agent)
    # Then
    assert (profile.run_timeout_s, profile.llm.idle_timeout_s, profile.tools.timeout_s) == (
        run_s,
        idle_s,
        tool_s,
    )


def test_config_file_named_by_unstuck_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("UNSTUCK_CONFIG", _write(tmp_path, {"agents": {"defaults": {"timeoutSeconds": 77}}}))
    assert load_settings().agents.defaults.run_timeout_s == 77


@pytest.mark.parametrize(
    ("env", "value", "path", "expected"),
    [
        ("UNSTUCK_AGENTS__DEFAULTS__RUN_TIMEOUT_S", "50", "agents.defaults.run_timeout_s", 50.0),
        ("UNSTUCK_LEASE__TTL_S", "8", "lease.ttl_s", 8.0),
        # Mappings merge key by key: the environment's entry wins, the file's others stay.
        ("UNSTUCK_TOOLS__TIMEOUTS_S", '{"exec": 9}', "tools.timeouts_s", {"exec": 9.0, "http_fetch": 15.5}),
    ],
)
def test_environment_beats_file(
    monkeypatch: pytest.MonkeyPatch, reference_file: str, env: str, value: str, path: str, expected: object
) -> None:
    # Given a file setting the same field
    monkeypatch.setenv("UNSTUCK_CONFIG", reference_file)
    monkeypatch.setenv(env, value)
    # When
    settings = load_settings()
    # Then the environment wins, and the rest of the file still applies
    found: Any = settings
    for part in path.split("."):
        found = getattr(found, part)
    assert found == expected
    assert settings.agents.defaults.llm.idle_timeout_s == 45


def test_keyword_arguments_beat_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNSTUCK_GATEWAY__GRACE_S", "5")
    assert load_settings(gateway={"grace_s": 1.5}).gateway.grace_s == 1.5


@pytest.mark.parametrize(
    ("config", "key_path", "reason"),
    [
        (
            {"agents": {"defaults": {"timeoutSecond": 5}}},
            "agents.defaults.timeoutSecond",
            "unknown key; did you mean 'timeoutSeconds'?",
        ),
        (
            {"agents": {"defaults": {"llm": {"idleTimeoutSecond": 5}}}},
            "agents.defaults.llm.idleTimeoutSecond",
            "unknown key; did you mean 'idleTimeoutSeconds'?",
        ),
        (
            {"agents": {"list": [{"id": "a", "tools": {"timeoutSecond": 3}}]}},
            "agents.list[0].tools.timeoutSecond",
            "unknown key; did you mean 'timeoutSeconds'?",
        ),
        ({"tools": {"timeout": {"exec": 3}}}, "tools.timeout", "unknown key; did you mean 'timeouts'?"),
        ({"agent": {}}, "agent", "unknown block; did you mean 'agents'?"),
        (
            {"agents": {"defaults": {"timeoutSeconds": -5}}},
            "agents.defaults.timeoutSeconds",
            "greater than 0",
        ),
        (
            {"agents": {"defaults": {"timeoutSeconds": "soon"}}},
            "agents.defaults.timeoutSeconds",
            "valid number",
        ),
        ({"agents": {"list": [{"id": ""}]}}, "agents.list[0].id", "at least 1 character"),
        ({"agents": {"list": [{"timeoutSeconds": 3}]}}, "agents.list[0].id", "Field required"),
        ({"tools": {"timeouts": {"exec": 0}}}, "tools.timeouts.exec", "greater than 0"),
    ],
)
def test_invalid_config_file_names_the_key_path(
    tmp_path: Path, config: dict[str, Any], key_path: str, reason: str
) -> None:
    # Given
    path = _write(tmp_path, config)
    # When
    error = _config_error(config=path)
    # Then
    assert f"{key_path}: " in str(error)
    assert [reason in why for where, why in error.problems if where == key_path] == [True], error.problems


def test_invalid_value_in_unstuck_block_names_the_file_path(tmp_path: Path) -> None:
    error = _config_error(config=_write(tmp_path, {"unstuck": {"lease": {"ttl_s": "soon"}}}))
    assert "unstuck.lease.ttl_s" in str(error)
    assert "UNSTUCK_LEASE__TTL_S" not in str(error)


def test_duplicate_agent_ids_are_rejected(tmp_path: Path) -> None:
    error = _config_error(
        config=_write(tmp_path, {"agents": {"list": [{"id": "a"}, {"id": "b"}, {"id": "a"}]}})
    )
    assert "'a' appears more than once" in str(error)


def test_duplicate_agent_ids_are_rejected_in_the_model() -> None:
    with pytest.raises(ValueError, match="more than once"):
        AgentsSettings.model_validate({"list": [{"id": "x"}, {"id": "x"}]})


def test_unknown_unrelated_keys_inside_blocks_are_ignored(tmp_path: Path) -> None:
    # Given keys of OpenClaw unstuck has no use for
    config = {"agents": {"defaults": {"model": "big", "workspace": "/w"}}, "tools": {"allow": ["exec"]}}
    # When / Then
    assert load_settings(config=_write(tmp_path, config)).agents.defaults.run_timeout_s == 1800


@pytest.mark.parametrize("block", ["channels", "models", "gatewayx", "session"])
def test_unknown_top_level_reference_blocks_are_ignored(tmp_path: Path, block: str) -> None:
    config = {block: {"anything": [1, 2]}, "agents": {"defaults": {"timeoutSeconds": 5}}}
    assert load_settings(config=_write(tmp_path, config)).agents.defaults.run_timeout_s == 5


def test_misspelt_key_in_unstuck_block_is_refused(tmp_path: Path) -> None:
    error = _config_error(config=_write(tmp_path, {"unstuck": {"lease": {"ttl_sx": 5}}}))
    assert "lease.ttl_sx" in str(error)


@pytest.mark.parametrize(
    ("data", "name", "fragment"),
    [
        ("{not json", "bad.json", "not valid json"),
        ("a = = 1", "bad.toml", "not valid toml"),
        ("[1, 2]", "list.json", "the top level must be an object"),
    ],
)
def test_unreadable_config_file(tmp_path: Path, data: str, name: str, fragment: str) -> None:
    assert fragment in str(_config_error(config=_write(tmp_path, data, name)))


def test_missing_config_file(tmp_path: Path) -> None:
    message = str(_config_error(config=str(tmp_path / "nope.json")))
    assert "UNSTUCK_CONFIG" in message
    assert "nope.json" in message


# --- cross-field rules ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ttl_s", "renew_s", "ok"),
    [(10, 2, True), (10, 5, True), (10, 5.01, False), (4, 3, False), (1, 0.5, True)],
)
def test_lease_renew_interval_must_be_at_most_half_the_ttl(ttl_s: float, renew_s: float, ok: bool) -> None:
    lease = {"ttl_s": ttl_s, "renew_interval_s": renew_s}
    if ok:
        assert load_settings(lease=lease).lease.renew_interval_s == renew_s
    else:
        assert "renew_interval_s must be at most half of ttl_s" in str(_config_error(lease=lease))


@pytest.mark.parametrize(
    ("overrides", "key_path"),
    [
        ({"lease": {"ttl_s": 0}}, "lease.ttl_s"),
        ({"gateway": {"grace_s": -1}}, "gateway.grace_s"),
        ({"redis": {"key_prefix": "has space"}}, "redis.key_prefix"),
        ({"worker": {"concurrency": 0}}, "worker.concurrency"),
        ({"nonsense": 1}, "nonsense"),
    ],
)
def test_invalid_values_name_the_key_path(overrides: dict[str, Any], key_path: str) -> None:
    error = _config_error(**overrides)
    assert any(path.startswith(key_path) for path, _ in error.problems), error.problems


# --- tool timeout precedence ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("configured", "declared", "agent", "expected"),
    [
        ({"exec": 30.0}, 60.0, "main", 30.0),  # config per tool beats the declared limit
        ({}, 60.0, "main", 60.0),  # the tool's own declared limit beats the agent default
        ({}, None, "main", 300.0),  # the agent default
        ({}, None, "slow", 900.0),  # that agent's own default
        ({"other": 1.0}, None, "slow", 900.0),
        ({"exec": 30.0}, None, "slow", 30.0),
    ],
)
def test_tool_timeout_precedence(
    configured: dict[str, float], declared: float | None, agent: str, expected: float
) -> None:
    # Given
    settings = load_settings(
        tools={"timeouts_s": configured},
        agents={"list": [{"id": "slow", "tool_timeout_s": 900}]},
    )
    # When / Then
    assert settings.tool_timeout_s(agent, "exec", declared) == expected


# --- units in names -------------------------------------------------------------------------------

# A duration is a float (counts and sizes are ints) or an int whose name says it is a time.
_TIME_WORDS = (
    "timeout",
    "ttl",
    "interval",
    "grace",
    "delay",
    "after",
    "allowance",
    "window",
    "age",
    "backoff",
)
_UNIT_SUFFIXES = ("_s", "_ms")
#: Floats that are ratios, not durations: they have no unit to name.
_RATIOS = ("multiplier",)


def _scalar_types(annotation: Any) -> set[type]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_scalar_types(arg) for arg in typing.get_args(annotation)))
    if origin is typing.Annotated:
        return _scalar_types(typing.get_args(annotation)[0])
    return {annotation} if isinstance(annotation, type) else set()


def _duration_offenders(model: type[BaseModel], prefix: str = "") -> list[str]:
    offenders: list[str] = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation = field.annotation
        origin = typing.get_origin(annotation)
        if origin is dict:
            # dict[str, float] of durations (tools.timeouts_s) carries the unit in its own name.
            value_type = typing.get_args(annotation)[1]
            scalars = _scalar_types(value_type)
        elif origin is tuple:
            for arg in typing.get_args(annotation):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    offenders += _duration_offenders(arg, f"{path}[].")
            continue
        else:
            scalars = _scalar_types(annotation)
        for sub in scalars:
            if issubclass(sub, BaseModel):
                offenders += _duration_offenders(sub, f"{path}.")
        is_float = float in scalars
        is_timed_int = int in scalars and bool not in scalars and any(w in name for w in _TIME_WORDS)
        if (is_float or is_timed_int) and not name.endswith(_UNIT_SUFFIXES) and name not in _RATIOS:
            offenders.append(path)
    return offenders


def test_every_duration_setting_names_its_unit() -> None:
    assert _duration_offenders(Settings) == []


def test_unit_check_can_fail() -> None:
    class Bad(BaseModel):
        timeout: float = 1.0
        ttl: int = 3
        retries: int = 2
        size_bytes: int = 1

    class Outer(BaseModel):
        inner: Bad = Bad()
        poll_s: float = 1.0

    assert _duration_offenders(Outer) == ["inner.timeout", "inner.ttl"]


def test_unit_check_sees_the_whole_tree() -> None:
    # The walk reaches nested and list-entry models, so a rename there would be caught.
    seen: list[str] = []

    def walk(model: type[BaseModel], prefix: str = "") -> None:
        for name, field in model.model_fields.items():
            seen.append(prefix + name)
            for sub in _scalar_types(field.annotation):
                if issubclass(sub, BaseModel):
                    walk(sub, f"{prefix}{name}.")
            if typing.get_origin(field.annotation) is tuple:
                for arg in typing.get_args(field.annotation):
                    if isinstance(arg, type) and issubclass(arg, BaseModel):
                        walk(arg, f"{prefix}{name}[].")

    walk(Settings)
    assert {"agents.defaults.llm.idle_timeout_s", "agents.list[].tool_timeout_s", "lease.ttl_s"} <= set(seen)


# --- tools: built-ins and allow/deny lists --------------------------------------------------------


def test_no_builtins_and_no_tool_lists_by_default() -> None:
    settings = Settings()
    assert settings.tools.builtins == ()
    assert (settings.tools.allow, settings.tools.deny) == ((), ())
    assert not settings.tool_policy("main").restricted


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("exec,http_fetch", ("exec", "http_fetch")),
        (" exec , ", ("exec",)),
        ('["http_fetch"]', ("http_fetch",)),
    ],
)
def test_tool_lists_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: tuple[str, ...]
) -> None:
    monkeypatch.setenv("UNSTUCK_TOOLS__BUILTINS", value)
    monkeypatch.setenv("UNSTUCK_TOOLS__ALLOW", value)
    monkeypatch.setenv("UNSTUCK_TOOLS__DENY", "group:builtins")
    settings = load_settings()
    assert settings.tools.builtins == expected
    assert settings.tools.allow == expected
    assert settings.tools.deny == ("group:builtins",)


@pytest.mark.parametrize(
    ("env", "value", "fragment"),
    [
        ("UNSTUCK_TOOLS__BUILTINS", "shell", "unknown built-in tool 'shell'"),
        ("UNSTUCK_TOOLS__ALLOW", "echo,group:fs", "unknown tool group 'group:fs'"),
        ("UNSTUCK_TOOLS__DENY", "group:builtin", "unknown tool group 'group:builtin'"),
    ],
)
def test_invalid_tool_lists_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, fragment: str
) -> None:
    monkeypatch.setenv(env, value)
    error = _config_error()
    assert env in str(error)
    assert fragment in str(error)


def test_config_file_tool_lists_and_agent_narrowing(tmp_path: Path) -> None:
    # Given OpenClaw's shape: global lists, builtins, and one agent's own lists
    path = _write(
        tmp_path,
        {
            "tools": {"builtins": ["exec"], "allow": ["echo", "group:builtins"], "deny": ["http_fetch"]},
            "agents": {"list": [{"id": "coder", "tools": {"allow": ["exec", "boom"], "deny": ["echo"]}}]},
        },
    )
    # When
    settings = load_settings(config=path)
    # Then the global lists apply to every agent and the agent's narrow them
    assert settings.tools.builtins == ("exec",)
    main, coder = settings.tool_policy("main"), settings.tool_policy("coder")
    assert [main.allows(t) for t in ("echo", "exec", "http_fetch", "boom")] == [True, True, False, False]
    assert [coder.allows(t) for t in ("echo", "exec", "http_fetch", "boom")] == [False, True, False, False]


@pytest.mark.parametrize(
    ("config", "key_path", "reason"),
    [
        ({"tools": {"alow": ["echo"]}}, "tools.alow", "did you mean 'allow'?"),
        ({"tools": {"denny": ["exec"]}}, "tools.denny", "did you mean 'deny'?"),
        ({"tools": {"builtin": ["exec"]}}, "tools.builtin", "did you mean 'builtins'?"),
        (
            {"agents": {"list": [{"id": "a", "tools": {"alow": ["x"]}}]}},
            "agents.list[0].tools.alow",
            "did you mean 'allow'?",
        ),
        (
            {"agents": {"defaults": {"tools": {"allow": ["x"]}}}},
            "agents.defaults.tools.allow",
            "use tools.allow",
        ),
        ({"tools": {"allow": "echo"}}, "tools.allow", "valid list"),
    ],
)
def test_tool_list_mistakes_in_the_config_file(
    tmp_path: Path, config: dict[str, Any], key_path: str, reason: str
) -> None:
    error = _config_error(config=_write(tmp_path, config))
    assert [reason in why for where, why in error.problems if where == key_path] == [True], error.problems


def test_a_cluster_store_needs_a_broker_of_its_own() -> None:
    # Celery's Redis transport cannot use a cluster, so redis.url cannot double as the broker
    with pytest.raises(ValueError, match=r"broker\.url"):
        Settings(redis={"url": "redis://node-1:7000/0", "cluster": True})
    settings = Settings(
        redis={"url": "redis://node-1:7000/0", "cluster": True}, broker={"url": "redis://q:6379/0"}
    )
    assert settings.broker_url == "redis://q:6379/0"
