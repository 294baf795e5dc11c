"""All configuration: one pydantic-settings ``Settings`` with nested models.

Sources, highest priority first: keyword arguments, environment (``UNSTUCK_*``, nested
with ``__``, e.g. ``UNSTUCK_LEASE__TTL_S=5``), the config file named by
``UNSTUCK_CONFIG`` (JSON5, so JSON, or TOML; see :mod:`workers.config_file`), defaults.

Every duration's name ends in ``_s`` or ``_ms``. The model is frozen.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from workers.config_file import ConfigFileSource, Seconds, read_upstreams
from workers.core.breaker import BreakerPolicy
from workers.core.did_you_mean import unknown_key_message
from workers.core.failure_policy import (
    BRANCH_REASONS,
    FALLBACK_REASONS,
    BranchRule,
    FailureRules,
    FallbackRule,
    check_reasons,
)
from workers.core.loops.config import agent_path, parse_loop_block, raised_thresholds
from workers.core.mcp_upstreams import Upstream
from workers.core.models import RetryPolicy
from workers.core.sentinel_url import SentinelAccess, is_sentinel_url, parse_sentinel_url
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


def _list_as_written(value: Any) -> Any:
    """A list setting written as text (the environment's only way): a JSON list, or comma-separated.

    Text that starts with ``[`` or ``{`` is read as JSON and must be a list without blank
    entries (a blank token would admit an empty bearer); anything else is split at commas,
    blanks dropped. An entry that holds a comma, or a first entry that starts with ``[`` or
    ``{``, needs the JSON form.
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text.startswith(("[", "{")):
        return tuple(part.strip() for part in text.split(",") if part.strip())
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:  # the text itself is not quoted back: it may be a secret
        raise ValueError(
            f"looks like a JSON list but is not valid JSON ({exc.msg} at character {exc.pos}); "
            'write a JSON list such as ["a", "b"] or a comma-separated list such as a,b'
        ) from None
    if not isinstance(parsed, list):
        raise ValueError('expected a JSON list such as ["a", "b"] or a comma-separated list such as a,b')
    blank = [i for i, item in enumerate(parsed) if isinstance(item, str) and not item.strip()]
    if blank:
        raise ValueError(f"entry {blank[0]} of the JSON list is blank")
    return parsed


def _known_groups(entries: tuple[str, ...]) -> tuple[str, ...]:
    unknown = unknown_groups(entries)
    if unknown:
        raise ValueError(f"unknown tool group {unknown[0]!r}; defined: group:builtins (and * for every tool)")
    return entries


#: A list of names: a JSON list or comma-separated as text (``NoDecode``: the text reaches the parser).
NameList = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_list_as_written)]
#: A tool allow or deny list: names, ``group:builtins`` or ``*``.
ToolList = NameList


class RedisSettings(BaseModel):
    """The Redis that holds the ledger, histories and leases."""

    model_config = _FROZEN

    url: str = Field(
        "",
        description="redis:// or rediss:// URL of the ledger, or Celery's Sentinel list "
        "(sentinel://h1:26379;sentinel://h2:26379, with redis.sentinel_master); empty: `unstuck up` "
        "and `unstuck demo` start an embedded redis-server, other commands refuse to start",
    )
    sentinel_master: str = Field(
        "",
        description="name of the primary the Sentinels of a sentinel:// redis.url watch "
        "(their `sentinel monitor` name); required with sentinel://, refused without it",
    )
    sentinel_password: SecretStr = Field(
        SecretStr(""),
        description="password of the Sentinels themselves (requirepass in sentinel.conf); "
        "the primary's password goes in the URL (sentinel://:password@h1:26379)",
    )
    sentinel_tls: bool = Field(
        False, description="talk TLS to the Sentinels and to the primary they name (rediss:// for both)"
    )
    primary_check_interval_ms: int = Field(
        500,
        ge=50,
        le=60_000,
        description="with a sentinel:// url: milliseconds between two questions each process asks the "
        "Sentinels about where the primary is; a connection to a node they no longer name is closed "
        "and opened again on the new primary (a stopped primary that resumes after its replica was "
        "promoted answers as a primary until the Sentinels demote it, 8-10 s later)",
    )
    key_prefix: str = Field(
        "unstuck",
        min_length=1,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="prefix of every key unstuck writes (letters, digits, _ . -)",
    )
    cluster: bool = Field(
        False,
        description="url names a node of a Redis Cluster: the store uses a cluster client "
        "(Celery cannot: set broker.url to a single Redis or RabbitMQ)",
    )
    socket_timeout_s: Seconds = Field(
        2.0,
        description="seconds one Redis command may take before it fails; a worker also drops a "
        "broker BRPOP whose reply is this much overdue (a silent primary)",
    )
    socket_connect_timeout_s: Seconds = Field(1.0, description="seconds a connection to Redis may take")
    min_replica_acks: int | None = Field(
        None,
        ge=0,
        description="replicas that must hold a registration, claim or result (WAIT, WAITAOF where the "
        "server has it and keeps an AOF) before it counts and anything is handed to an agent; unset: 1 "
        "when the primary reports a replica, 0 on a lone Redis (read from INFO at the first write; on "
        "Redis Cluster from each primary's own INFO); 0 turns it off",
    )
    replica_ack_timeout_ms: int = Field(
        1000, ge=1, description="milliseconds one WAIT for redis.min_replica_acks replicas may block"
    )
    replica_ack_retry_s: Seconds = Field(
        10.0,
        description="seconds a write whose WAIT came back short (or whose primary failed) is sent again, "
        "to whichever server is primary by then, before its caller gets ReplicasBehind",
    )

    @property
    def sentinel(self) -> bool:
        """Whether ``url`` lists Sentinels, so every client follows the primary they name."""
        return is_sentinel_url(self.url)

    def sentinel_access(self) -> SentinelAccess | None:
        """How clients find the primary of a ``sentinel://`` url; None for any other url."""
        if not self.sentinel:
            return None
        return SentinelAccess(
            url=parse_sentinel_url(self.url),
            master=self.sentinel_master,
            sentinel_password=self.sentinel_password.get_secret_value() or None,
            tls=self.sentinel_tls,
            primary_check_interval_s=self.primary_check_interval_ms / 1000,
        )

    @model_validator(mode="after")
    def _sentinel_consistent(self) -> RedisSettings:
        if not self.sentinel:
            if self.sentinel_master:
                raise ValueError(
                    "redis.sentinel_master is set but redis.url is not a sentinel:// list: "
                    "write redis.url as sentinel://h1:26379;sentinel://h2:26379, or unset sentinel_master"
                )
            return self
        parse_sentinel_url(self.url)  # a ValueError names the bad part
        if not self.sentinel_master:
            raise ValueError(
                "a sentinel:// redis.url needs redis.sentinel_master (UNSTUCK_REDIS__SENTINEL_MASTER): "
                "the name the Sentinels monitor the primary under"
            )
        if self.cluster:
            raise ValueError("redis.cluster and a sentinel:// redis.url exclude each other: pick one")
        return self


class SigningSettings(BaseModel):
    """``broker.signing``: Celery's message signing (the ``auth`` serializer), off until configured.

    Every process (worker, watchdog, beat, gateway, CLI) signs what it sends with its key and
    refuses any message not signed by a certificate in ``cert_store``. Set all three paths or
    none; it needs the ``unstuck[signing]`` extra (``cryptography``). See ``deploy/signing.md``.
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

    url: str = Field(
        "",
        description="broker URL (redis://, rediss://, sentinel:// with redis.sentinel_master, "
        "amqp://); empty means redis.url",
    )
    queue: str = Field("unstuck.tools", description="the tool queue: consumed by tool workers only")
    control_queue: str = Field(
        "unstuck.control", description="the watchdog's queue: consumed by `unstuck watchdog` only"
    )
    publish_timeout_s: Seconds = Field(
        1.0,
        description="seconds handing a call to the broker may take (connect, send, retries); "
        "a call not handed over is answered dispatch_failed",
    )
    task_events_flush_ms: NonNegativeInt = Field(
        200,
        description="task events (what Flower shows) are batched this long into one message; "
        "0: each batch at once (a worker: at its next event-loop tick, as Celery does)",
    )
    signing: SigningSettings = SigningSettings()


class LlmSettings(BaseModel):
    """Limits for the agent loop's own model calls."""

    model_config = _FROZEN

    idle_timeout_s: Seconds = Field(
        90.0,
        description="seconds the model stream may go without a chunk before the idle guard raises "
        "StreamIdleTimeout (file: llm.idleTimeoutSeconds)",
    )


class ToolDefaults(BaseModel):
    """Per-agent tool defaults."""

    model_config = _FROZEN

    timeout_s: Seconds = Field(
        300.0, description="soft limit, seconds, of a tool with none of its own (file: tools.timeoutSeconds)"
    )
    loop_detection: dict[str, Any] | None = Field(
        None, description="loop-detection block (file: tools.loopDetection); none: the global block"
    )


class AgentProfile(BaseModel):
    """The effective settings of one agent (defaults merged with its own block)."""

    model_config = _FROZEN

    run_timeout_s: Seconds = Field(
        1800.0, description="deadline of a whole run, seconds from its start (file: timeoutSeconds)"
    )
    llm: LlmSettings = LlmSettings()
    tools: ToolDefaults = ToolDefaults()


class AgentOverride(BaseModel):
    """One ``agents.list[]`` entry: only the fields it sets override the defaults."""

    model_config = _FROZEN

    id: str = Field(min_length=1, description="the agent id a gateway call names (agent_id)")
    run_timeout_s: Seconds | None = Field(None, description="run deadline, seconds (file: timeoutSeconds)")
    llm_idle_timeout_s: Seconds | None = Field(
        None, description="model stream idle limit, seconds (file: llm.idleTimeoutSeconds)"
    )
    tool_timeout_s: Seconds | None = Field(
        None, description="default tool soft limit, seconds (file: tools.timeoutSeconds)"
    )
    loop_detection: dict[str, Any] | None = Field(
        None, description="loop-detection block (file: tools.loopDetection), merged over the defaults'"
    )
    tool_allow: ToolList = Field((), description="agents.list[].tools.allow: narrows tools.allow")
    tool_deny: ToolList = Field((), description="agents.list[].tools.deny: added to tools.deny")

    _groups = field_validator("tool_allow", "tool_deny")(_known_groups)


class AgentsSettings(BaseModel):
    """Agent defaults and per-agent overrides."""

    model_config = _FROZEN

    defaults: AgentProfile = AgentProfile()
    list: Annotated[tuple[AgentOverride, ...], NoDecode, BeforeValidator(_list_as_written)] = Field(
        (), description="per-agent overrides, one entry per agent id (JSON in the environment)"
    )

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
    reasons: NameList = Field((), description="only these failure reasons (empty: every failure)")

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
    reasons: NameList = Field(
        ("tool_error", "timeout_soft"), min_length=1, description="failures that try the branch"
    )

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
    backoff_s: NonNegativeFloat = Field(0.5, description="seconds before the second attempt")
    multiplier: float = Field(
        2.0, ge=1, allow_inf_nan=False, description="each later delay is the one before times this"
    )
    max_backoff_s: NonNegativeFloat = Field(10.0, description="longest delay between attempts, seconds")
    errors: NameList = Field(
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
    timeouts_s: dict[str, Seconds] = Field(
        default_factory=dict, description="soft limit per tool name, seconds (file: tools.timeouts)"
    )
    memory_limits_mb: dict[str, NonNegativeInt] = Field(
        default_factory=dict,
        description="memory limit of a call per tool name, MB (file: tools.memoryLimits); 0: none; "
        "wins over the tool's memory_limit_mb",
    )
    loop_detection: dict[str, Any] | None = Field(
        None, description="loop-detection block for every agent (file: tools.loopDetection); none: off"
    )
    breakers: dict[str, BreakerPolicy] = Field(
        default_factory=dict, description="shared circuit breakers, per tool name (opt-in)"
    )
    fallbacks: dict[str, FallbackSettings] = Field(
        default_factory=dict, description="a default value instead of a failure, per tool name"
    )
    fail_branch: dict[str, FailBranchSettings] = Field(
        default_factory=dict,
        validation_alias=AliasChoices("fail_branch", "failBranch"),
        description="another tool tried once when the first fails, per tool name (file: failBranch)",
    )
    retry: dict[str, RetrySettings] = Field(
        default_factory=dict, description="retry policy per tool name (replaces the decorator's)"
    )

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

    hard_grace_s: PositiveFloat = Field(
        5.0, description="seconds: hard limit = soft limit + this, unless the tool declares one"
    )
    queue_allowance_s: PositiveFloat = Field(
        5.0, description="seconds a call may wait in the queue (part of its deadline)"
    )
    max_argument_bytes: PositiveInt = Field(
        256 * 1024, description="arguments longer than this as JSON are answered invalid_arguments"
    )
    max_result_bytes: PositiveInt = Field(
        256 * 1024, description="result texts longer than this, in UTF-8 bytes, are cut with a marker"
    )
    cancel_grace_s: PositiveFloat = Field(
        5.0, description="seconds a cancelled tool has to stop after SIGTERM, before SIGKILL"
    )
    memory_limit_mb: NonNegativeInt = Field(
        1024,
        description="memory a call may add, its tool and every process it starts, MB, unless the tool "
        "or tools.memory_limits_mb says otherwise; 0: none; past it: out_of_memory",
    )
    memory_cgroups: bool = Field(
        True,
        description="a memory cgroup per pool child, re-armed per call, where the worker may create one "
        "(exact count; OOM kills answered out_of_memory); off or unavailable: RLIMIT_DATA only",
    )


class LeaseSettings(BaseModel):
    """Worker leases on running calls: how fast a dead host is noticed."""

    model_config = _FROZEN

    # 4 s answers a dead host within 5 s (expiry plus the waiter's next look) and still
    # outlasts a 2 s stall of the worker's main process, which renews every 0.5 s at most.
    ttl_s: PositiveFloat = Field(
        4.0, description="seconds a running call's lease lasts unrenewed before its worker counts as lost"
    )
    renew_interval_s: PositiveFloat = Field(
        1.0, description="how often workers renew their leases, seconds; at most half of ttl_s"
    )

    @model_validator(mode="after")
    def _renew_before_expiry(self) -> LeaseSettings:
        if self.renew_interval_s * 2 > self.ttl_s:
            raise ValueError("renew_interval_s must be at most half of ttl_s, or live leases expire")
        return self


class GatewaySettings(BaseModel):
    """The client side: how late past a deadline an answer may come."""

    model_config = _FROZEN

    grace_s: PositiveFloat = Field(
        2.0, description="how late past its deadline a call may be answered, seconds"
    )
    check_interval_s: PositiveFloat = Field(
        0.5, description="how often a waiting gateway checks leases and deadlines, seconds"
    )
    # A worker killed between taking a message and claiming its call loses the message.
    republish_unclaimed: bool = Field(
        True,
        description="publish a call's message again when no worker claimed it a lease.ttl_s after "
        "it was published (then after 2, 4, ... TTLs); off: such a call waits for its deadline "
        "(for calls that routinely queue longer than a lease, where the refused copies cost more)",
    )


class LedgerSettings(BaseModel):
    """How long call records and results are kept."""

    model_config = _FROZEN

    ttl_s: PositiveInt = Field(
        24 * 3600,
        description="seconds call records and results are kept, past the call's deadline and its answer",
    )


class WatchdogSettings(BaseModel):
    """The beat-driven stuck-session watchdog."""

    model_config = _FROZEN

    interval_s: PositiveFloat = Field(15.0, description="seconds between the sweeps beat schedules")
    stalled_after_s: PositiveFloat = Field(
        120.0,
        description="seconds without activity (tool or agent heartbeat) after which a running "
        "session is stalled (a worker runs one of its calls) or stuck",
    )
    auto_recover: bool = Field(
        False, description="recover stuck sessions: answer calls cancelled, revoke tasks, free the lane"
    )
    webhook_url: str = Field(
        "", description="JSON POST on a session entering stalled or stuck (retried); empty: none"
    )

    @property
    def sweep_lock_ttl_s(self) -> float:
        """How long one sweep may hold the sweep lock; a sweep is stopped before it runs out."""
        return max(30.0, self.interval_s * 3)


def _has_default_budget(budgets: dict[str, float]) -> dict[str, float]:
    if "*" not in budgets:
        raise ValueError('openclaw.budgets_s needs a "*" entry: the budget of every other tool')
    return budgets


class OpenClawSettings(BaseModel):
    """OpenClaw's own tool calls and sessions, reported by its plugin (integrations/openclaw)."""

    model_config = _FROZEN

    # OpenClaw's own limits plus a grace: tools.exec.timeoutSeconds (1800 s) and the run timeout
    # `doctor` advises (1800 s, not the 48 h default), so unstuck acts only where OpenClaw would not.
    budgets_s: Annotated[dict[str, PositiveFloat], AfterValidator(_has_default_budget)] = Field(
        default_factory=lambda: {"exec": 1830.0, "*": 1830.0},
        description='seconds a call of each OpenClaw tool may run before the watchdog ends it ("*": '
        'every other tool), e.g. {"exec": 5, "*": 120}',
    )
    stuck_after_s: PositiveFloat = Field(
        300.0, description="seconds a running OpenClaw session may show no activity before it is alerted"
    )
    recover: bool = Field(
        False,
        description="after alerting a stuck OpenClaw session, end its open exec calls' process trees "
        "(and abort its run through the gateway when openclaw.cli is set)",
    )
    cli: str = Field(
        "", description="the openclaw command, for gateway RPC (sessions.abort, sessions.send); empty: none"
    )
    gateway_url: str = Field("", description="the OpenClaw gateway's WebSocket URL; empty: the CLI's default")
    gateway_token: SecretStr = Field(SecretStr(""), description="the OpenClaw gateway's token; empty: none")
    tombstone_scan_interval_s: PositiveFloat = Field(60.0, description="seconds between two tombstone scans")
    alert_target: str = Field("", description="send stuck/tombstoned alerts here too (channel:C1); empty: no")
    alert_channel: str = Field("", description="alert_target's channel (slack, ...); empty: the only one")
    alert_account: str = Field("", description="the account alert_target is sent from; empty: default")

    def budget_s(self, tool: str) -> float:
        """The budget of one call of ``tool``."""
        return self.budgets_s.get(tool, self.budgets_s["*"])


class AlertsSettings(BaseModel):
    """Where alerts about OpenClaw's calls and sessions go (besides the log and the events stream)."""

    model_config = _FROZEN

    webhook_url: str = Field("", description="JSON POST per OpenClaw alert; empty: watchdog.webhook_url")


class TranscriptSettings(BaseModel):
    """Transcript repair: per-provider policy overrides (``"*"`` applies to every provider)."""

    model_config = _FROZEN

    policy_overrides: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description='transcript policy fields per provider ("*": every provider)'
    )


class WorkerSettings(BaseModel):
    """Worker processes."""

    model_config = _FROZEN

    concurrency: PositiveInt = Field(2, description="pool processes of `unstuck worker` (-c overrides)")
    pool: str = Field(
        "prefork",
        description="ignored: `unstuck worker` always runs prefork, the only pool that enforces time limits",
    )
    prefetch_multiplier: PositiveInt = Field(
        1,
        description="Celery's prefetch multiplier: the messages a worker takes ahead, per pool process",
    )
    give_back_after_ms: NonNegativeInt = Field(
        250,
        description="publish again, for any worker, a message this worker took ahead and no pool process "
        "started in this long (the copy claimed first runs); 0: none, and on a Redis broker take a "
        "message only for a free pool process",
    )
    max_memory_per_child_kb: PositiveInt | None = Field(
        None, description="recycle a pool child above this resident size, KiB; none: never"
    )
    log_each_task: bool = Field(
        False,
        description="Celery's INFO lines for every task in the worker log (received; succeeded in, raised "
        "expected, ignored); off: a task's warnings and errors only (each call stays in the ledger, "
        "Flower's task events and its spans), about a tenth more throughput (docs/performance.md)",
    )
    flush_spans_each_call: bool = Field(
        True,
        description="with tracing on (docs/tracing.md): a pool child sends its spans after every call, "
        "so a child that crashes on its next call loses none; off: every 200 ms, cheaper, and a child "
        "that dies within 200 ms of a call's end takes that call's span with it",
    )


class ApiSettings(BaseModel):
    """The network doors: the HTTP API (``unstuck serve``) and the MCP server (``unstuck mcp``)."""

    model_config = _FROZEN

    host: str = Field("127.0.0.1", description="address both doors bind; off loopback only with tokens")
    port: int = Field(8765, ge=1, le=65535, description="port of `unstuck serve`")
    mcp_port: int = Field(8766, ge=1, le=65535, description="port of `unstuck mcp` (Streamable HTTP)")
    tokens: Annotated[tuple[SecretStr, ...], NoDecode, BeforeValidator(_list_as_written)] = Field(
        (), description='bearer tokens accepted (a,b or ["a","b"]); none: loopback only, no auth'
    )
    max_body_bytes: PositiveInt = Field(
        1_048_576, description="request bodies larger than this many bytes are refused (HTTP 413)"
    )
    max_waiting: PositiveInt = Field(
        1024, description="tool-calls requests `unstuck serve` waits on at once; more queue"
    )
    mcp_run_idle_s: PositiveFloat = Field(
        300.0, description="seconds with no call open after which the MCP door ends its run"
    )


class McpSettings(BaseModel):
    """The MCP door answers each call ``answer_margin_s`` before ``client_timeout_s`` at the latest."""

    model_config = _FROZEN  # the margin is checked where it is used (workers.servers.mcp_late_results)
    client_timeout_s: PositiveFloat = Field(60.0, description="MCP clients' timeout (requestTimeoutMs)")
    answer_margin_s: PositiveFloat = Field(2.0, description="answer still_running this long before it")
    upstreams_file: str = Field(
        "", description='MCP servers unstuck serves as <name>__<tool>: a JSON {"mcpServers": {...}} file'
    )
    _upstreams: dict[str, Upstream] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _read_upstreams(self) -> McpSettings:
        self._upstreams = read_upstreams(self.upstreams_file) if self.upstreams_file else {}
        return self

    def upstreams(self) -> dict[str, Upstream]:
        """The checked entries of ``upstreams_file`` (read once, when the settings load)."""
        return dict(self._upstreams)


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
    openclaw: OpenClawSettings = OpenClawSettings()
    alerts: AlertsSettings = AlertsSettings()
    tool_modules: NameList = Field(
        (), description='modules that define tools, imported by workers and gateways (a,b or ["a","b"])'
    )
    config: str = Field("", description="path of a JSON5 (or JSON) or TOML config file (UNSTUCK_CONFIG)")

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
        if is_sentinel_url(self.broker.url):
            parse_sentinel_url(self.broker.url)
            if not self.redis.sentinel_master:
                raise ValueError(
                    "a sentinel:// broker.url needs redis.sentinel_master (UNSTUCK_REDIS__SENTINEL_MASTER)"
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
    # A list entry has no variable of its own: the list's variable holds it (as JSON).
    names = list(itertools.takewhile(lambda part: not isinstance(part, int), loc))
    return "UNSTUCK_" + "__".join(str(part).upper() for part in names)


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
    """Loop-detection blocks are validated strictly at start-up, not when first used.

    A misordered threshold triple is no error: it is raised into order at resolution, as
    OpenClaw does, and logged here as a warning naming the key and the new value.
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
