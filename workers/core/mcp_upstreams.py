"""The MCP servers unstuck stands in front of: the ``{"mcpServers": {...}}`` file, checked.

The shape is the one Claude Desktop, Cursor, VS Code and OpenClaw read, so a block moves over
unchanged: a stdio entry has ``command``, ``args``, ``env``, ``cwd``; a remote entry ``url``,
``headers`` and an optional ``transport``. An entry may add an ``"unstuck"`` object with its
limits (``soft_timeout_s``, ``hard_timeout_s``, ``memory_limit_mb``, ``retry``) and the same
keys per tool under ``tools``. Keys unstuck does not know are refused, naming the entry.

An entry marked ``"stateful": true`` (in its ``"unstuck"`` object) keeps state in memory (a
browser's page, a REPL): its calls go to a queue of their own (:func:`upstream_queue`), which
one worker with one pool child serves, so every client meets the one upstream process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)

from workers.core.models import RetryPolicy
from workers.errors import ConfigError

__all__ = [
    "TOOL_SEPARATOR",
    "UPSTREAM_QUEUE_INFIX",
    "RemoteUpstream",
    "StdioUpstream",
    "Upstream",
    "UpstreamLimits",
    "parse_upstreams",
    "served_name",
    "served_upstream",
    "upstream_queue",
]

TOOL_SEPARATOR: Final = "__"
UPSTREAM_QUEUE_INFIX: Final = ".mcp."
_FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
# Keys hosts write into their own blocks that mean nothing here (``type`` is VS Code's
# "stdio"/"http", ``disabled`` Cursor's): accepted so a block moves over as it is.
_HOST_KEYS: Final = ("type", "disabled", "autoApprove", "alwaysAllow", "timeout", "requestTimeoutMs")


class RetryLimits(BaseModel):
    """``retry`` as an object: the same fields as ``tools.retry.<tool>`` (transient failures only)."""

    model_config = _FROZEN

    attempts: PositiveInt
    backoff_s: float = Field(0.5, ge=0)
    multiplier: float = Field(2.0, ge=1)
    max_backoff_s: float = Field(10.0, ge=0)


class UpstreamLimits(BaseModel):
    """The ``"unstuck"`` object of an entry, or of one of its tools."""

    model_config = _FROZEN

    soft_timeout_s: PositiveFloat | None = None
    hard_timeout_s: PositiveFloat | None = None
    memory_limit_mb: int | None = Field(None, ge=0)
    retry: PositiveInt | RetryLimits | None = None

    @model_validator(mode="after")
    def _hard_after_soft(self) -> UpstreamLimits:
        soft, hard = self.soft_timeout_s, self.hard_timeout_s
        if soft is not None and hard is not None and hard <= soft:
            raise ValueError(f"hard_timeout_s ({hard}) must be greater than soft_timeout_s ({soft})")
        return self

    def retry_policy(self) -> RetryPolicy | None:
        """The retry policy these limits give (an integer is the number of attempts)."""
        if self.retry is None:
            return None
        if isinstance(self.retry, int):
            return RetryPolicy(attempts=self.retry)
        return RetryPolicy(
            attempts=self.retry.attempts,
            backoff_s=self.retry.backoff_s,
            multiplier=self.retry.multiplier,
            max_backoff_s=self.retry.max_backoff_s,
        )

    def over(self, base: UpstreamLimits) -> UpstreamLimits:
        """These limits, each unset one taken from ``base`` (a tool's over its server's)."""
        return base.model_copy(update=self.model_dump(exclude_none=True))


class EntryLimits(UpstreamLimits):
    """An entry's ``"unstuck"`` object: its limits, per-tool ``tools``, and ``stateful``."""

    tools: dict[str, UpstreamLimits] = Field(default_factory=dict)
    #: It keeps state in memory: one process serves every call (see the module doc).
    stateful: bool = False

    def for_tool(self, tool: str) -> UpstreamLimits:
        """The limits of ``tool``: its own, each unset one taken from the entry's."""
        base = UpstreamLimits(**self.model_dump(exclude={"tools", "stateful"}))
        own = self.tools.get(tool)
        return own.over(base) if own is not None else base


class _Entry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, populate_by_name=True)

    name: str
    unstuck: EntryLimits = EntryLimits()


class StdioUpstream(_Entry):
    """An MCP server unstuck starts itself and talks to over stdin/stdout."""

    command: str = Field(min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None

    def describe(self) -> str:
        """The command line, for logs and ``unstuck config check``."""
        return " ".join([self.command, *self.args])


class RemoteUpstream(_Entry):
    """An MCP server that already runs, reached over Streamable HTTP (or SSE)."""

    url: str = Field(pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict)
    transport: Literal["streamable-http", "http", "sse"] = "streamable-http"

    def describe(self) -> str:
        """The URL (headers may hold tokens: never shown)."""
        return self.url


Upstream = StdioUpstream | RemoteUpstream


def served_name(upstream: str, tool: str) -> str:
    """The name unstuck serves an upstream's tool under: ``<name>__<tool>``."""
    return f"{upstream}{TOOL_SEPARATOR}{tool}"


def upstream_queue(tool_queue: str, upstream: str) -> str:
    """The queue of a stateful upstream's calls: ``<tool queue>.mcp.<name>``."""
    return f"{tool_queue}{UPSTREAM_QUEUE_INFIX}{upstream}"


def served_upstream(tool_queue: str, queues: Iterable[str]) -> str:
    """The stateful upstream whose queue is among ``queues`` (a worker's), or ""."""
    prefix = f"{tool_queue}{UPSTREAM_QUEUE_INFIX}"
    return next((queue.removeprefix(prefix) for queue in queues if queue.startswith(prefix)), "")


def parse_upstreams(data: object, *, source: str = "mcpServers") -> dict[str, Upstream]:
    """The entries of an ``{"mcpServers": {...}}`` document, each checked.

    Raises:
        ConfigError: naming each entry that does not fit, with the key and why.
    """
    if not isinstance(data, Mapping) or not isinstance(data.get("mcpServers"), Mapping):
        raise ConfigError([(source, 'must be a JSON object {"mcpServers": {"<name>": {...}}}')])
    problems: list[tuple[str, str]] = []
    upstreams: dict[str, Upstream] = {}
    for name, entry in data["mcpServers"].items():
        where = f"{source}: mcpServers.{name}"
        try:
            upstreams[name] = _entry(str(name), entry)
        except ValueError as exc:
            problems.extend(_problems(where, exc))
    if problems:
        raise ConfigError(problems)
    return upstreams


def _entry(name: str, entry: object) -> Upstream:
    if not name or TOOL_SEPARATOR in name or not name.replace("-", "_").isidentifier():
        raise ValueError(f"the name must be letters, digits, - or _ (and no {TOOL_SEPARATOR!r})")
    if not isinstance(entry, Mapping):
        raise ValueError("must be an object with command or url")
    fields: dict[str, Any] = {k: v for k, v in entry.items() if k not in _HOST_KEYS}
    if ("command" in fields) == ("url" in fields):
        raise ValueError("needs exactly one of command (a stdio server) or url (a remote server)")
    kind: type[Upstream] = StdioUpstream if "command" in fields else RemoteUpstream
    return kind.model_validate({**fields, "name": name})


def _problems(where: str, exc: ValueError) -> list[tuple[str, str]]:
    if not isinstance(exc, ValidationError):
        return [(where, str(exc))]
    found = []
    for error in exc.errors():
        path = ".".join(str(part) for part in error["loc"])
        found.append((f"{where}.{path}" if path else where, error["msg"]))
    return found
