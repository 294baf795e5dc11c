"""All configuration: one pydantic-settings ``Settings`` with nested models.

Sources, highest priority first: keyword arguments, environment (``UNSTUCK_*``, nested
with ``__``, e.g. ``UNSTUCK_LEASE__TTL_S=5``), the config file named by
``UNSTUCK_CONFIG`` (JSON5, so JSON, or TOML; see :mod:`workers.config_file`), defaults.

Every duration's name ends in ``_s`` or ``_ms``. The model is frozen.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Annotated, Any

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from workers.config_file import ConfigFileSource, Seconds
from workers.core.breakers import BreakerPolicy
from workers.core.did_you_mean import unknown_key_message
from workers.core.failure_policy import (
    BRANCH_REASONS,
    FALLBACK_REASONS,
    BranchRule,
    FailureRules,
    FallbackRule,
    check_reasons,
)
from workers.core.limits import RetryPolicy
from workers.core.loops.config import agent_path, parse_loop_block, raised_thresholds
from workers.core.tool_policy import BUILTIN_TOOLS, ToolPolicy, ToolRules, unknown_groups
from workers.errors import ConfigError

__all__ = [
    "AgentOverride",
    "AgentProfile",
    "AgentsSettings",
    "BrokerSettings",
    "FailBranchSettings",
    "FallbackSettings",
    "GatewaySettings",
    "LeaseSettings",
    "LedgerSettings",
    "LimitSettings",
    "LlmSettings",
    "McpSettings",
    "RedisSettings",
    "RetrySettings",
    "Settings",
    "SigningSettings",
    "ToolDefaults",
    "ToolsSettings",
    "TranscriptSettings",
    "WatchdogSettings",
    "WorkerSettings",
    "check_loop_blocks",
    "load_settings",
    "process_environment",
]

log = logging.getLogger(__name__)

_FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def _split_modules(value: Any) -> Any:
    """A comma-separated string or a JSON list (as in the environment) becomes a tuple."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


def _known_groups(entries: tuple[str, ...]) -> tuple[str, ...]:
    unknown = unknown_groups(entries)
    if unknown:
        raise ValueError(f"unknown tool group {unknown[0]!r}; defined: group:builtins (and * for every tool)")
    return entries


#: A tool allow or deny list: names, ``group:builtins`` or ``*``; comma-separated in the environment.
ToolList = Annotated[tuple[str, ...], NoDecode]


class RedisSettings(BaseModel):
    """The Redis that holds the ledger, histories and leases."""

    model_config = _FROZEN

    url: str = Field("", description="redis:// or rediss:// URL; empty starts an embedded redis-server")
    key_prefix: str = Field("unstuck", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    cluster: bool = Field(
        False,
        description="url names a node of a Redis Cluster: the store uses a cluster client "
        "(Celery cannot: set broker.url to a single Redis or RabbitMQ)",
    )
    socket_timeout_s: Seconds = 2.0
    socket_connect_timeout_s: Seconds = 1.0


class SigningSettings(BaseModel):
    """``broker.signing``: Celery's message signing (the ``auth`` serializer), off until configured.

    Every process (worker, watchdog, beat, gateway, CLI) signs what it sends with its key and
    refuses any message not signed by a certificate in ``cert_store``. Set all three paths or
    none; see ``deploy/signing.md``.
    """

    model_config = _FROZEN

    key_file: str = Field("", description="PEM private key (RSA) this process signs its messages with")
    cert_file: str = Field("", description="PEM certificate of that key")
    cert_store: str = Field("", description="directory of PEM certificates whose signatures are accepted")
    key_password: SecretStr = Field(SecretStr(""), description="password of an encrypted key_file")
    digest: str = Field("sha256", description="hash the signatures use")

    @property
    def enabled(self) -> bool:
        """Whether messages are signed and verified."""
        return bool(self.key_file or self.cert_file or self.cert_store)

    @model_validator(mode="after")
    def _all_or_nothing(self) -> SigningSettings:
        missing = [name for name in ("key_file", "cert_file", "cert_store") if not getattr(self, name)]
        if self.enabled and missing:
            raise ValueError(f"signing needs key_file, cert_file and cert_store; missing: {missing}")
        return self


class BrokerSettings(BaseModel):
    """The Celery broker; defaults to the ledger's Redis."""

    model_config = _FROZEN

    url: str = Field("", description="broker URL (redis://, rediss://, amqp://); empty means redis.url")
    queue: str = Field("unstuck.tools", description="the tool queue: consumed by tool workers only")
    control_queue: str = Field(
        "unstuck.control", description="the watchdog's queue: consumed by `unstuck watchdog` only"
    )
    publish_timeout_s: Seconds = 1.0
    task_events_flush_ms: NonNegativeInt = Field(
        200,
        description="task events (what Flower shows) are batched this long into one message; "
        "0: each batch at once (a worker: at its next event-loop tick, as Celery does)",
    )
    signing: SigningSettings = SigningSettings()


class LlmSettings(BaseModel):
    """Limits for the agent loop's own model calls."""

    model_config = _FROZEN

    idle_timeout_s: Seconds = 90.0


class ToolDefaults(BaseModel):
    """Per-agent tool defaults."""

    model_config = _FROZEN

    timeout_s: Seconds = 300.0
    loop_detection: dict[str, Any] | None = None


class AgentProfile(BaseModel):
    """The effective settings of one agent (defaults merged with its own block)."""

    model_config = _FROZEN

    run_timeout_s: Seconds = 1800.0
    llm: LlmSettings = LlmSettings()
    tools: ToolDefaults = ToolDefaults()


class AgentOverride(BaseModel):
    """One ``agents.list[]`` entry: only the fields it sets override the defaults."""

    model_config = _FROZEN

    id: str = Field(min_length=1)
    run_timeout_s: Seconds | None = None
    llm_idle_timeout_s: Seconds | None = None
    tool_timeout_s: Seconds | None = None
    loop_detection: dict[str, Any] | None = None
    tool_allow: tuple[str, ...] = Field((), description="agents.list[].tools.allow: narrows tools.allow")
    tool_deny: tuple[str, ...] = Field((), description="agents.list[].tools.deny: added to tools.deny")

    _lists = field_validator("tool_allow", "tool_deny", mode="before")(_split_modules)
    _groups = field_validator("tool_allow", "tool_deny")(_known_groups)


class AgentsSettings(BaseModel):
    """Agent defaults and per-agent overrides."""

    model_config = _FROZEN

    defaults: AgentProfile = AgentProfile()
    list: tuple[AgentOverride, ...] = ()

    @field_validator("list")
    @classmethod
    def _unique_ids(cls, entries: tuple[AgentOverride, ...]) -> tuple[AgentOverride, ...]:
        seen: set[str] = set()
        for entry in entries:
            if entry.id in seen:
                raise ValueError(f"agent id {entry.id!r} appears more than once")
            seen.add(entry.id)
        return entries

    def for_agent(self, agent_id: str) -> AgentProfile:
        """The defaults overridden field by field by ``agent_id``'s own entry, if any."""
        entry = next((e for e in self.list if e.id == agent_id), None)
        base = self.defaults
        if entry is None:
            return base
        return AgentProfile(
            run_timeout_s=entry.run_timeout_s or base.run_timeout_s,
            llm=LlmSettings(idle_timeout_s=entry.llm_idle_timeout_s or base.llm.idle_timeout_s),
            tools=ToolDefaults(
                timeout_s=entry.tool_timeout_s or base.tools.timeout_s,
                loop_detection=(
                    entry.loop_detection if entry.loop_detection is not None else base.tools.loop_detection
                ),
            ),
        )


class FallbackSettings(BaseModel):
    """``tools.fallbacks.<tool>``: a default value answered instead of a failure."""

    model_config = _FROZEN

    value: Any = Field(description="returned as a normal result (strings as is, others as JSON)")
    reasons: tuple[str, ...] = Field((), description="only these failure reasons (empty: every failure)")

    @field_validator("reasons")
    @classmethod
    def _known(cls, reasons: tuple[str, ...]) -> tuple[str, ...]:
        check_reasons(reasons, FALLBACK_REASONS)
        return reasons

    def rule(self) -> FallbackRule:
        """The pure rule every result writer applies."""
        return FallbackRule(self.value, check_reasons(self.reasons, FALLBACK_REASONS))


class FailBranchSettings(BaseModel):
    """``tools.failBranch.<tool>``: another tool tried once, on the worker, when the first fails."""

    model_config = _FROZEN

    tool: str = Field(min_length=1, description="the alternative tool; called with the same arguments")
    reasons: tuple[str, ...] = Field(("tool_error", "timeout_soft"), min_length=1)

    @field_validator("reasons")
    @classmethod
    def _known(cls, reasons: tuple[str, ...]) -> tuple[str, ...]:
        check_reasons(reasons, BRANCH_REASONS)
        return reasons

    def rule(self) -> BranchRule:
        """The pure rule the worker applies."""
        return BranchRule(self.tool, check_reasons(self.reasons, BRANCH_REASONS))


class RetrySettings(BaseModel):
    """``tools.retry.<tool>``: the decorator's retry policy, from config (it replaces the decorator's)."""

    model_config = _FROZEN

    attempts: PositiveInt = Field(description="runs in all, counting the first")
    backoff_s: NonNegativeFloat = 0.5
    multiplier: float = Field(2.0, ge=1, allow_inf_nan=False)
    max_backoff_s: NonNegativeFloat = 10.0
    errors: tuple[str, ...] = Field(
        ("Exception",),
        min_length=1,
        description="exception class names retried (matched along the class's bases); "
        "an exception with retryable = True is always retried",
    )

    def policy(self) -> RetryPolicy:
        """The same :class:`RetryPolicy` the decorator takes."""
        return RetryPolicy(
            attempts=self.attempts,
            backoff_s=self.backoff_s,
            multiplier=self.multiplier,
            max_backoff_s=self.max_backoff_s,
            retry_on_names=self.errors,
        )


class ToolsSettings(BaseModel):
    """Tool loading, which tools may be called, and per-tool overrides."""

    model_config = _FROZEN

    builtins: ToolList = Field(
        (), description="built-in tools to register (exec, http_fetch); none by default"
    )
    allow: ToolList = Field((), description="only these tools may be called (empty: every registered tool)")
    deny: ToolList = Field((), description="these tools may never be called (wins over allow)")
    timeouts_s: dict[str, Seconds] = Field(default_factory=dict)
    loop_detection: dict[str, Any] | None = None
    breakers: dict[str, BreakerPolicy] = Field(
        default_factory=dict, description="shared circuit breakers, per tool name (opt-in)"
    )
    fallbacks: dict[str, FallbackSettings] = Field(default_factory=dict)
    fail_branch: dict[str, FailBranchSettings] = Field(
        default_factory=dict, validation_alias=AliasChoices("fail_branch", "failBranch")
    )
    retry: dict[str, RetrySettings] = Field(default_factory=dict)

    _lists = field_validator("builtins", "allow", "deny", mode="before")(_split_modules)

    @model_validator(mode="after")
    def _no_branch_to_itself(self) -> ToolsSettings:
        for name, branch in self.fail_branch.items():
            if branch.tool == name:
                raise ValueError(f"fail_branch.{name}: a tool cannot be its own fail-branch")
        return self

    def failure_rules(self) -> FailureRules:
        """Fallbacks, fail-branches and retry policies from config, as pure rules."""
        return FailureRules(
            fallbacks={name: entry.rule() for name, entry in self.fallbacks.items()},
            branches={name: entry.rule() for name, entry in self.fail_branch.items()},
            retries={name: entry.policy() for name, entry in self.retry.items()},
        )

    _groups = field_validator("allow", "deny")(_known_groups)

    @field_validator("builtins")
    @classmethod
    def _known_builtins(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if name not in BUILTIN_TOOLS:
                raise ValueError(f"unknown built-in tool {name!r}; built-ins: {', '.join(BUILTIN_TOOLS)}")
        return names


class LimitSettings(BaseModel):
    """How call limits derive from the configured timeouts."""

    model_config = _FROZEN

    hard_grace_s: PositiveFloat = Field(5.0, description="hard limit = soft limit + this, unless declared")
    queue_allowance_s: PositiveFloat = Field(5.0, description="time a call may wait in the queue")
    max_argument_bytes: PositiveInt = 256 * 1024
    max_result_bytes: PositiveInt = 256 * 1024
    cancel_grace_s: PositiveFloat = Field(
        5.0, description="a cancelled tool's time to stop after SIGTERM, before SIGKILL"
    )


class LeaseSettings(BaseModel):
    """Worker leases on running calls: how fast a dead host is noticed."""

    model_config = _FROZEN

    ttl_s: PositiveFloat = 10.0
    renew_interval_s: PositiveFloat = 2.0

    @model_validator(mode="after")
    def _renew_before_expiry(self) -> LeaseSettings:
        if self.renew_interval_s * 2 > self.ttl_s:
            raise ValueError("renew_interval_s must be at most half of ttl_s, or live leases expire")
        return self


class GatewaySettings(BaseModel):
    """The client side: how late past a deadline an answer may come."""

    model_config = _FROZEN

    grace_s: PositiveFloat = 2.0
    check_interval_s: PositiveFloat = 0.5
    # A call no worker claimed a lease TTL after it was published gets its message published
    # again (then after 2, 4, ... TTLs): a worker killed between taking a message and claiming
    # its call loses the message. Off: such a call waits for its deadline, and calls that
    # routinely queue longer than a lease get no refused copies.
    republish_unclaimed: bool = True


class LedgerSettings(BaseModel):
    """How long call records and results are kept."""

    model_config = _FROZEN

    ttl_s: PositiveInt = 24 * 3600


class WatchdogSettings(BaseModel):
    """The beat-driven stuck-session watchdog."""

    model_config = _FROZEN

    interval_s: PositiveFloat = 15.0
    stalled_after_s: PositiveFloat = 120.0
    auto_recover: bool = False
    webhook_url: str = ""

    @property
    def sweep_lock_ttl_s(self) -> float:
        """How long one sweep may hold the sweep lock; a sweep is stopped before it runs out."""
        return max(30.0, self.interval_s * 3)


class TranscriptSettings(BaseModel):
    """Transcript repair: per-provider policy overrides (``"*"`` applies to every provider)."""

    model_config = _FROZEN

    policy_overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)


class WorkerSettings(BaseModel):
    """Worker processes."""

    model_config = _FROZEN

    concurrency: PositiveInt = 2
    pool: str = "prefork"
    prefetch_multiplier: PositiveInt = 1
    max_memory_per_child_kb: PositiveInt | None = None


class ApiSettings(BaseModel):
    """The network doors: the HTTP API (``unstuck serve``) and the MCP server (``unstuck mcp``)."""

    model_config = _FROZEN

    host: str = Field("127.0.0.1", description="address both doors bind; off loopback only with tokens")
    port: int = Field(8765, ge=1, le=65535, description="port of `unstuck serve`")
    mcp_port: int = Field(8766, ge=1, le=65535, description="port of `unstuck mcp` (Streamable HTTP)")
    tokens: Annotated[tuple[SecretStr, ...], NoDecode] = Field(
        (), description="bearer tokens accepted (comma-separated); none: loopback only, no auth"
    )
    max_body_bytes: PositiveInt = 1_048_576
    max_waiting: PositiveInt = Field(1024, description="tool-calls requests `unstuck serve` waits on at once")
    mcp_run_idle_s: PositiveFloat = Field(300.0, description="an MCP session's run ends after this idle gap")

    @field_validator("tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value


class McpSettings(BaseModel):
    """The MCP door answers each call ``answer_margin_s`` before ``client_timeout_s`` at the latest."""

    model_config = _FROZEN  # the margin is checked where it is used (workers.doors.mcp_late_results)
    client_timeout_s: PositiveFloat = Field(60.0, description="MCP clients' timeout (requestTimeoutMs)")
    answer_margin_s: PositiveFloat = Field(2.0, description="answer still_running this long before it")


class Settings(BaseSettings):
    """Everything unstuck reads from its environment and config file."""

    model_config = SettingsConfigDict(
        env_prefix="UNSTUCK_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
        allow_inf_nan=False,
    )

    redis: RedisSettings = RedisSettings()
    broker: BrokerSettings = BrokerSettings()
    agents: AgentsSettings = AgentsSettings()
    tools: ToolsSettings = ToolsSettings()
    limits: LimitSettings = LimitSettings()
    lease: LeaseSettings = LeaseSettings()
    gateway: GatewaySettings = GatewaySettings()
    ledger: LedgerSettings = LedgerSettings()
    watchdog: WatchdogSettings = WatchdogSettings()
    worker: WorkerSettings = WorkerSettings()
    transcript: TranscriptSettings = TranscriptSettings()
    api: ApiSettings = ApiSettings()
    mcp: McpSettings = McpSettings()
    tool_modules: Annotated[tuple[str, ...], NoDecode] = ()
    config: str = Field("", description="path of a JSON5 (or JSON) or TOML config file (UNSTUCK_CONFIG)")

    _split = field_validator("tool_modules", mode="before")(_split_modules)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments, then environment, then the config file."""
        return init_settings, env_settings, ConfigFileSource(settings_cls)

    @model_validator(mode="after")
    def _broker_off_the_cluster(self) -> Settings:
        if self.redis.cluster and not self.broker.url:
            raise ValueError(
                "redis.cluster needs its own broker.url: Celery's Redis transport cannot use a cluster"
            )
        return self

    @property
    def broker_url(self) -> str:
        """The effective broker URL."""
        return self.broker.url or self.redis.url

    def tool_policy(self, agent_id: str) -> ToolPolicy:
        """The tools ``agent_id`` may call: ``tools.allow/deny``, narrowed by its own entry."""
        layers = [ToolRules(allow=self.tools.allow, deny=self.tools.deny)]
        entry = next((e for e in self.agents.list if e.id == agent_id), None)
        if entry is not None:
            layers.append(ToolRules(allow=entry.tool_allow, deny=entry.tool_deny))
        return ToolPolicy(tuple(layers))

    def tool_timeout_s(self, agent_id: str, tool_name: str, declared_s: float | None) -> float:
        """Soft limit of a tool: config per tool, else the tool's own, else the agent's default."""
        if tool_name in self.tools.timeouts_s:
            return self.tools.timeouts_s[tool_name]
        if declared_s is not None:
            return declared_s
        return self.agents.for_agent(agent_id).tools.timeout_s


def process_environment() -> dict[str, str]:
    """A copy of this process's environment, for children we start (worker, beat, Flower).

    Reading the environment is this module's job alone; everything else asks here.
    """
    return dict(os.environ)


def _env_name(loc: tuple[int | str, ...]) -> str:
    return "UNSTUCK_" + "__".join(str(part).upper() for part in loc)


def load_settings(**overrides: Any) -> Settings:
    """Build and validate ``Settings``; raises ``ConfigError`` naming every bad key path."""
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        problems = [
            (
                f"{'.'.join(str(p) for p in err['loc'])} ({_env_name(err['loc'])})",
                unknown_key_message(Settings, err["loc"]) if err["type"] == "extra_forbidden" else err["msg"],
            )
            for err in exc.errors()
        ]
        raise ConfigError(problems) from None
    check_loop_blocks(settings)
    return settings


def check_loop_blocks(settings: Settings) -> None:
    """Loop-detection blocks are validated strictly at start-up (spec §2), not when first used.

    A misordered threshold triple is no error: it is raised into order at resolution, as the
    reference system does, and logged here as a warning naming the key and the new value.
    """
    blocks = [("tools.loopDetection", settings.tools.loop_detection)]
    blocks.append(("agents.defaults.tools.loopDetection", settings.agents.defaults.tools.loop_detection))
    blocks += [(agent_path(i), e.loop_detection) for i, e in enumerate(settings.agents.list)]
    problems: list[tuple[str, str]] = []
    for path, block in blocks:
        if block is None:
            continue
        try:
            parse_loop_block(block, path)
        except ConfigError as exc:
            problems += exc.problems
            continue
        for where, why in raised_thresholds(block, path):
            log.warning("config: %s: %s", where, why)
    if problems:
        raise ConfigError(problems)
