"""The optional config file (``UNSTUCK_CONFIG``): JSON5 (so plain JSON) or TOML, in OpenClaw's shape.

Users bring their existing config. These camelCase blocks are read::

    agents.defaults.timeoutSeconds               whole run (default 1800)
    agents.defaults.llm.idleTimeoutSeconds       model stream idle limit (default 90)
    agents.defaults.tools.timeoutSeconds         per-tool default (default 300)
    agents.defaults.tools.loopDetection          per-agent loop detection defaults
    agents.list[].id + the same blocks            per-agent overrides, field by field
    agents.list[].tools.allow / .deny            per-agent tool lists (narrow the global ones)
    tools.timeouts.<toolName>                    per-tool soft limit in seconds
    tools.memoryLimits.<toolName>                per-tool memory limit of a call in MB (0: none)
    tools.loopDetection                          global loop detection block
    tools.allow / tools.deny                     which tools may be called (names, group:builtins, *)
    tools.builtins                               built-in tools to register (exec, http_fetch)
    tools.fallbacks.<toolName>                   {value, reasons?}: a default instead of a failure
    tools.failBranch.<toolName>                  {tool, reasons?}: another tool tried once on failure
    tools.retry.<toolName>                       {attempts, backoff_s?, multiplier?, errors?}

and an ``unstuck`` block holding our own settings in their snake_case names (``redis``,
``lease``, ...). Other top-level blocks of OpenClaw's config are ignored. Inside the
blocks above, a key that looks like a misspelt known key is an error ("did you mean");
any other unknown key is logged as ignored. Invalid values raise ``ConfigError`` naming
the key path as written in the file.
"""

from __future__ import annotations

import difflib
import json
import logging
import tomllib
from pathlib import Path
from typing import Annotated, Any

import json5
from pydantic import (
    AliasChoices,
    AliasGenerator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    TypeAdapter,
    ValidationError,
)
from pydantic.alias_generators import to_camel
from pydantic_settings import PydanticBaseSettingsSource

from workers.core.did_you_mean import known_keys, unknown_key_message
from workers.core.mcp_upstreams import Upstream, parse_upstreams
from workers.errors import ConfigError

__all__ = [
    "MAX_SECONDS",
    "ConfigFileSource",
    "Seconds",
    "read_config_file",
    "read_upstreams",
    "translate_reference_config",
]

log = logging.getLogger(__name__)

MAX_SECONDS = 30 * 24 * 3600
#: A duration in seconds: positive, finite and at most 30 days (larger values overflow
#: the broker's visibility timeout arithmetic and are never what anyone meant).
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]

_CAMEL = ConfigDict(
    extra="allow", allow_inf_nan=False, alias_generator=AliasGenerator(validation_alias=to_camel)
)


class _Llm(BaseModel):
    model_config = _CAMEL
    idle_timeout_seconds: Seconds | None = None


class _Tools(BaseModel):
    model_config = _CAMEL
    timeout_seconds: Seconds | None = None
    loop_detection: dict[str, Any] | None = None
    allow: list[str] | None = None
    deny: list[str] | None = None


class _AgentBlock(BaseModel):
    model_config = _CAMEL
    timeout_seconds: Seconds | None = None
    llm: _Llm | None = None
    tools: _Tools | None = None


class _AgentEntry(_AgentBlock):
    id: str = Field(min_length=1)


class _Agents(BaseModel):
    model_config = _CAMEL
    defaults: _AgentBlock | None = None
    entries: list[_AgentEntry] | None = Field(None, validation_alias="list")


class _GlobalTools(BaseModel):
    model_config = _CAMEL
    timeouts: dict[str, Seconds] | None = None
    memory_limits: dict[str, NonNegativeInt] | None = None
    loop_detection: dict[str, Any] | None = None
    allow: list[str] | None = None
    deny: list[str] | None = None
    builtins: list[str] | None = None
    fallbacks: dict[str, dict[str, Any]] | None = None
    fail_branch: dict[str, dict[str, Any]] | None = Field(
        None, validation_alias=AliasChoices("failBranch", "fail_branch")
    )
    retry: dict[str, dict[str, Any]] | None = None


class _Reference(BaseModel):
    model_config = ConfigDict(extra="ignore")
    agents: _Agents | None = None
    tools: _GlobalTools | None = None
    unstuck: dict[str, Any] | None = None


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _alias(model: type[BaseModel], name: str) -> str:
    alias = model.model_fields[name].validation_alias
    return alias if isinstance(alias, str) else to_camel(name)


def _unknown_keys(model: BaseModel, loc: tuple[int | str, ...]) -> list[tuple[tuple[int | str, ...], str]]:
    """Every extra key under ``model`` with the known keys it could have meant."""
    found: list[tuple[tuple[int | str, ...], str]] = []
    # Names and aliases both (a user may write snake_case); a high cutoff, because OpenClaw's
    # other keys (tools.exec, tools.web, ...) are legitimately here and only ignored.
    known = known_keys(type(model))
    for key in model.model_extra or {}:
        found.append(((*loc, key), ", ".join(difflib.get_close_matches(key, known, n=1, cutoff=0.75))))
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = enumerate(value) if isinstance(value, list) else [(None, value)]
        for index, item in items:
            if isinstance(item, BaseModel) and item.model_config.get("extra") == "allow":
                key = _alias(type(model), name)
                sub = (*loc, key) if index is None else (*loc, key, index)
                found.extend(_unknown_keys(item, sub))
    return found


def _check_unknown(reference: _Reference, raw: dict[str, Any]) -> None:
    problems: list[tuple[str, str]] = []
    for top in raw:
        near = difflib.get_close_matches(top, ["agents", "tools", "unstuck"], n=1, cutoff=0.8)
        if top not in ("agents", "tools", "unstuck") and near:
            problems.append((top, f"unknown block; did you mean {near[0]!r}?"))
    for block in (reference.agents, reference.tools):
        if block is None:
            continue
        name = "agents" if block is reference.agents else "tools"
        for loc, meant in _unknown_keys(block, (name,)):
            if meant:
                problems.append((_path(loc), f"unknown key; did you mean {meant!r}?"))
            else:
                log.info("config: ignoring %s (not used by unstuck)", _path(loc))
    if problems:
        raise ConfigError(problems)


def _agent_fields(block: _AgentBlock, *, flat: bool) -> dict[str, Any]:
    llm_idle = block.llm.idle_timeout_seconds if block.llm else None
    tool_timeout = block.tools.timeout_seconds if block.tools else None
    loops = block.tools.loop_detection if block.tools else None
    if flat:
        out = {
            "run_timeout_s": block.timeout_seconds,
            "llm_idle_timeout_s": llm_idle,
            "tool_timeout_s": tool_timeout,
            "loop_detection": loops,
            "tool_allow": block.tools.allow if block.tools else None,
            "tool_deny": block.tools.deny if block.tools else None,
        }
        return {k: v for k, v in out.items() if v is not None}
    nested: dict[str, Any] = {}
    if block.timeout_seconds is not None:
        nested["run_timeout_s"] = block.timeout_seconds
    if llm_idle is not None:
        nested["llm"] = {"idle_timeout_s": llm_idle}
    tools = {"timeout_s": tool_timeout, "loop_detection": loops}
    tools = {k: v for k, v in tools.items() if v is not None}
    if tools:
        nested["tools"] = tools
    return nested


def _refuse_default_tool_lists(defaults: _AgentBlock) -> None:
    # A security list that would be silently ignored is worse than an error.
    lists = [
        name for name in ("allow", "deny") if defaults.tools and getattr(defaults.tools, name) is not None
    ]
    if lists:
        raise ConfigError(
            [
                (
                    f"agents.defaults.tools.{name}",
                    f"not supported: use tools.{name} (every agent) or agents.list[].tools.{name}",
                )
                for name in lists
            ]
        )


def translate_reference_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Validate a OpenClaw-shaped config and map it onto ``Settings`` field names."""
    try:
        reference = _Reference.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError([(_path(err["loc"]), err["msg"]) for err in exc.errors()]) from None
    _check_unknown(reference, raw)
    out: dict[str, Any] = dict(reference.unstuck or {})
    agents: dict[str, Any] = {}
    if reference.agents and reference.agents.defaults:
        _refuse_default_tool_lists(reference.agents.defaults)
        agents["defaults"] = _agent_fields(reference.agents.defaults, flat=False)
    if reference.agents and reference.agents.entries is not None:
        agents["list"] = [{"id": e.id, **_agent_fields(e, flat=True)} for e in reference.agents.entries]
    if agents:
        out["agents"] = agents
    tools: dict[str, Any] = {}
    if reference.tools and reference.tools.timeouts is not None:
        tools["timeouts_s"] = reference.tools.timeouts
    if reference.tools and reference.tools.memory_limits is not None:
        tools["memory_limits_mb"] = reference.tools.memory_limits
    if reference.tools and reference.tools.loop_detection is not None:
        tools["loop_detection"] = reference.tools.loop_detection
    for name in ("allow", "deny", "builtins", "fallbacks", "fail_branch", "retry"):
        value = getattr(reference.tools, name) if reference.tools else None
        if value is not None:
            tools[name] = value
    if tools:
        out["tools"] = tools
    return out


def read_config_file(path: str) -> dict[str, Any]:
    """Parse a JSON5 (so JSON) or TOML file into a dict; raises ``ConfigError`` on any problem."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([("UNSTUCK_CONFIG", f"cannot read {path}: {exc.strerror}")]) from None
    toml = file.suffix.lower() == ".toml"
    try:
        # JSON5 is a superset of JSON: OpenClaw's file (comments, trailing commas,
        # unquoted keys) loads as written, and plain JSON is JSON5.
        data: Any = tomllib.loads(text) if toml else json5.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        kind = "toml" if toml else "json/json5"
        raise ConfigError([(path, f"not valid {kind}: {exc}")]) from None
    if not isinstance(data, dict):
        raise ConfigError([(path, "the top level must be an object")])
    return data


class ConfigFileSource(PydanticBaseSettingsSource):
    """pydantic-settings source reading the file named by the ``config`` setting."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        """Unused: the whole file is mapped at once in ``__call__``."""
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        """The file's settings mapped onto ``Settings`` field names ({} without a file)."""
        path = self.current_state.get("config")
        if not path:
            return {}
        translated = translate_reference_config(read_config_file(str(path)))
        _check_own_block(
            self.settings_cls, {k: v for k, v in translated.items() if k not in ("agents", "tools")}
        )
        return translated


def _check_own_block(settings_cls: type[BaseModel], block: dict[str, Any]) -> None:
    """Validate the `unstuck` block alone, so errors name the path as written in the file."""
    problems: list[tuple[str, str]] = []
    for key, value in block.items():
        field = settings_cls.model_fields.get(key)
        if field is None:
            near = difflib.get_close_matches(key, list(settings_cls.model_fields), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            problems.append((f"unstuck.{key}", "unknown key" + hint))
            continue
        try:
            TypeAdapter(field.annotation or Any).validate_python(value)
        except ValidationError as exc:
            problems += [
                (
                    _path(("unstuck", key, *err["loc"])),
                    unknown_key_message(settings_cls, (key, *err["loc"]))
                    if err["type"] == "extra_forbidden"
                    else err["msg"],
                )
                for err in exc.errors()
            ]
    if problems:
        raise ConfigError(problems)


def read_upstreams(path: str) -> dict[str, Upstream]:
    """Read and check the upstreams file at ``path``.

    Raises:
        ConfigError: the file cannot be read, is not JSON, or an entry does not fit (named).
    """
    where = f"mcp.upstreams_file {path}"
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise ConfigError([(where, f"cannot be read: {exc.strerror or exc}")]) from None
    except json.JSONDecodeError as exc:
        raise ConfigError([(where, f"is not JSON: {exc}")]) from None
    return parse_upstreams(data, source=where)
