"""``unstuck config show|check``: the effective merged config, and its risky settings.

``show`` prints every setting after env, config file and defaults are merged (``--agent``
gives one agent's effective profile and resolved loop detection). Secrets in URLs are
redacted: passwords and user names (``redis://:****@host``), query values named like a
token or key, and the path of webhook URLs (where chat webhooks keep their secret).

``check`` exits 0 and prints one ``warning:`` line per risky setting (see
:mod:`workers.core.config_checks`), or exits 2 with the config error, without a traceback.

``reference`` prints docs/configuration.md, rendered from ``Settings`` (see
:mod:`workers.cli.config_reference`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from workers.core.config_checks import (
    AgentLimits,
    ConfigWarning,
    ToolLimits,
    check_config,
    check_failure_tools,
)
from workers.core.deployment_checks import check_deployment
from workers.core.loops.config import resolve_loop_config
from workers.core.redact import redact_settings
from workers.errors import ConfigError, StoreError
from workers.settings import Settings, check_loop_blocks, load_settings

__all__ = ["collect_warnings", "effective_config", "register"]

_EXIT_INVALID = 2


def register(subparsers: Any) -> None:
    """Add the ``config`` sub-command group."""
    config = subparsers.add_parser("config", help="show or check the effective configuration")
    commands = config.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    show = commands.add_parser("show", help="print the effective merged config (secrets redacted)")
    show.add_argument("--agent", metavar="ID", help="one agent's effective profile")
    show.add_argument("--json", action="store_true", help="print JSON instead of key = value lines")
    show.set_defaults(func=_show)
    check = commands.add_parser("check", help="warn about risky settings; exit 2 when the config is invalid")
    check.set_defaults(func=_check)
    reference = commands.add_parser("reference", help="print the settings reference page (Markdown)")
    reference.set_defaults(func=_reference)


def effective_config(settings: Settings, agent_id: str | None = None) -> dict[str, Any]:
    """The merged settings as plain data; with ``agent_id``, that agent's profile replaces ``agents``.

    Raises:
        ConfigError: when the agent's loop-detection blocks cannot be resolved.
    """
    data: dict[str, Any] = settings.model_dump(mode="json")
    if agent_id is not None:
        profile = settings.agents.for_agent(agent_id)
        loops = resolve_loop_config(settings.tools.loop_detection, profile.tools.loop_detection)
        del data["agents"]
        data["agent"] = {
            "id": agent_id,
            "listed": any(entry.id == agent_id for entry in settings.agents.list),
            **profile.model_dump(mode="json"),
            "loop_detection_resolved": loops.model_dump(mode="json"),
        }
    redacted: dict[str, Any] = redact_settings(data)
    return redacted


def _flatten(data: Any, prefix: str = "") -> list[str]:
    if isinstance(data, dict) and data:
        return [line for k, v in data.items() for line in _flatten(v, f"{prefix}.{k}" if prefix else str(k))]
    return [f"{prefix} = {json.dumps(data, sort_keys=True)}"]


def _show(args: argparse.Namespace) -> int:
    try:
        settings = load_settings()
        data = effective_config(settings, args.agent)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return _EXIT_INVALID
    if args.agent is not None and not data["agent"]["listed"]:
        print(f"note: agent {args.agent!r} has no agents.list entry; the defaults apply", file=sys.stderr)
    print(json.dumps(data, indent=2, sort_keys=True) if args.json else "\n".join(_flatten(data)))
    return 0


def _agent_limits(settings: Settings) -> list[AgentLimits]:
    base = settings.agents.defaults
    agents = [
        AgentLimits(
            "agents.defaults",
            "defaults",
            base.run_timeout_s,
            base.llm.idle_timeout_s,
            base.tools.loop_detection,
        )
    ]
    for index, entry in enumerate(settings.agents.list):
        agents.append(
            AgentLimits(
                f"agents.list[{index}]",
                f"agent {entry.id!r}",
                entry.run_timeout_s,
                entry.llm_idle_timeout_s,
                entry.loop_detection,
            )
        )
    return agents


def _tool_limits(settings: Settings) -> list[ToolLimits]:
    from workers.tools.loader import load_tools

    configured = settings.tools.timeouts_s
    default_s = settings.agents.defaults.tools.timeout_s
    tools = []
    for name, spec in sorted(
        load_tools(
            settings.tool_modules, builtins=settings.tools.builtins, upstreams=settings.mcp.upstreams()
        ).items()
    ):
        if name in configured:
            soft_s, path = configured[name], f"tools.timeouts.{name}"
        elif spec.soft_timeout_s is not None:
            soft_s, path = spec.soft_timeout_s, f"tool {name} (soft_timeout_s in code)"
        else:
            soft_s, path = default_s, "agents.defaults.tools.timeoutSeconds"
        tools.append(ToolLimits(name, soft_s, spec.hard_timeout_s, path))
    registered = {tool.name for tool in tools}
    tools += [
        ToolLimits(name, soft_s, None, f"tools.timeouts.{name}")
        for name, soft_s in sorted(configured.items())
        if name not in registered
    ]
    return tools


def collect_warnings(settings: Settings) -> list[ConfigWarning]:
    """Every risky setting of ``settings``, after its tools are loaded.

    Raises:
        ConfigError: when a loop-detection block is invalid or a tool module does not load.
    """
    check_loop_blocks(settings)
    deployment = check_deployment(
        redis_url=settings.redis.url,
        broker_url=settings.broker.url,
        signing_enabled=settings.broker.signing.enabled,
    )
    found = deployment + check_config(
        agents=_agent_limits(settings),
        global_loop_block=settings.tools.loop_detection,
        tools=_tool_limits(settings),
        lease_ttl_s=settings.lease.ttl_s,
        builtins=settings.tools.builtins,
        allow=settings.tools.allow,
        deny=settings.tools.deny,
    )
    return found + _failure_tool_warnings(settings) + _upstream_warnings()


def _upstream_warnings() -> list[ConfigWarning]:
    """Each MCP upstream that could not start (tools were loaded just before): left out, and why."""
    from workers.tools.upstreams import upstream_failures

    return [
        ConfigWarning(
            f"mcp.upstreams_file: mcpServers.{failure.name}",
            f"cannot start ({failure.command}); its tools are left out: {failure.error}",
        )
        for failure in upstream_failures()
    ]


def _failure_tool_warnings(settings: Settings) -> list[ConfigWarning]:
    from workers.tools.loader import load_tools

    tools = settings.tools
    return check_failure_tools(
        load_tools(settings.tool_modules, builtins=tools.builtins, upstreams=settings.mcp.upstreams()),
        {
            "tools.fallbacks": tools.fallbacks,
            "tools.retry": tools.retry,
            "tools.failBranch": tools.fail_branch,
        },
        {name: branch.tool for name, branch in tools.fail_branch.items()},
    )


def redis_report(settings: Settings) -> tuple[list[ConfigWarning], str | None]:
    """The configured Redis's warnings (replicas, AOF, noeviction) and what its replicas mean.

    The meaning is None when Redis was not read; nothing at all without a URL.
    """
    from workers.core.durability_checks import check_durability, replicas_meaning
    from workers.runtime import open_ledger
    from workers.store.server import durability_of

    if not settings.redis.url or settings.redis.cluster:
        return [], None
    try:
        ledger = open_ledger(settings)
        try:
            found = durability_of(ledger.client)
        finally:
            ledger.close()
    except StoreError as exc:
        return [
            ConfigWarning(
                "unstuck.redis.url", f"could not read the Redis's replication and persistence: {exc}"
            )
        ], None
    return check_durability(found), replicas_meaning(found)


def _check(args: argparse.Namespace) -> int:
    try:
        settings = load_settings()
        found, replicas = redis_report(settings)
        warnings = collect_warnings(settings) + found
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return _EXIT_INVALID
    if replicas is not None:
        print(f"redis: {replicas}")
    for warning in warnings:
        print(f"warning: {warning}")
    print(f"{len(warnings)} warning(s)" if warnings else "config ok: no risky settings found")
    return 0


def _reference(args: argparse.Namespace) -> int:
    from workers.cli.config_reference import render_page

    sys.stdout.write(render_page())
    return 0
