"""Risky-but-valid settings, found from plain values (``unstuck config check``).

Each check takes numbers and dicts, never ``Settings``, and returns :class:`ConfigWarning`
values naming the key path as the user writes it in the config file. The risks are the
ones OpenClaw's users ran into: a run allowed to last hours, a model stream
with no idle limit, loop detection off, a soft limit that can never fire before the hard
one, a lease that outlives the shortest tool call, and a shell tool open to every agent.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from workers.core.did_you_mean import closest_key
from workers.core.loops.config import merge_loop_blocks, raised_thresholds, resolve_loop_config
from workers.core.tool_policy import ToolRules

__all__ = [
    "HUGE_IDLE_TIMEOUT_S",
    "LONG_RUN_TIMEOUT_S",
    "AgentLimits",
    "ConfigWarning",
    "ToolLimits",
    "check_agent",
    "check_builtins",
    "check_config",
    "check_failure_tools",
    "check_lease",
    "check_loop_detection",
    "check_tiers",
    "check_tools",
]

LONG_RUN_TIMEOUT_S: Final = 3600.0
HUGE_IDLE_TIMEOUT_S: Final = 600.0


@dataclass(frozen=True)
class ConfigWarning:
    """One risky setting: where it is (key path) and why it is risky."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass(frozen=True)
class AgentLimits:
    """What one agent block sets; ``None`` means inherited from the defaults.

    ``path`` is the block's key path (``agents.defaults`` or ``agents.list[2]``).
    """

    path: str
    label: str
    run_timeout_s: float | None
    llm_idle_timeout_s: float | None
    loop_detection: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ToolLimits:
    """A registered tool's effective soft limit and its declared hard limit, if any."""

    name: str
    soft_s: float
    hard_s: float | None
    soft_path: str


def check_agent(agent: AgentLimits) -> list[ConfigWarning]:
    """Run timeout of an hour or more; LLM idle timeout unset, huge, or not below the run timeout."""
    found: list[ConfigWarning] = []
    run_s, idle_s = agent.run_timeout_s, agent.llm_idle_timeout_s
    if run_s is not None and run_s >= LONG_RUN_TIMEOUT_S:
        found.append(
            ConfigWarning(
                f"{agent.path}.timeoutSeconds",
                f"{agent.label}: a run may last {run_s:g}s (>= 1 h) before it is aborted; "
                "a stuck run holds its session that long",
            )
        )
    idle_path = f"{agent.path}.llm.idleTimeoutSeconds"
    if idle_s is None and agent.path == "agents.defaults":
        found.append(ConfigWarning(idle_path, "unset: a silent model stream hangs until the run deadline"))
    elif idle_s is not None and idle_s >= HUGE_IDLE_TIMEOUT_S:
        found.append(
            ConfigWarning(idle_path, f"{agent.label}: {idle_s:g}s (>= 10 min) before a silent stream fails")
        )
    if idle_s is not None and run_s is not None and idle_s >= run_s:
        found.append(
            ConfigWarning(
                idle_path, f"{agent.label}: not below the run timeout ({run_s:g}s), so it never fires"
            )
        )
    return found


def _enabled(block: Mapping[str, Any]) -> bool:
    return block.get("enabled") is True


def check_loop_detection(
    global_block: Mapping[str, Any] | None,
    defaults_block: Mapping[str, Any] | None,
    agents: Sequence[AgentLimits] = (),
) -> list[ConfigWarning]:
    """Loop detection off for the defaults, or switched off by an agent's own block.

    The effective block of an agent is ``tools.loopDetection`` merged with the agent's own
    block, or with the defaults block when the agent has none.
    """
    found: list[ConfigWarning] = []
    default_block = merge_loop_blocks(global_block, defaults_block)
    default_on = _enabled(default_block)
    where = "tools.loopDetection" if defaults_block is None else "agents.defaults.tools.loopDetection"
    found += check_tiers(default_block, where, "defaults")
    if not default_on:
        why = "missing" if global_block is None and defaults_block is None else "enabled is not true"
        found.append(
            ConfigWarning(
                "tools.loopDetection",
                f"loop detection is off ({why}): an agent repeating a call is never warned or stopped",
            )
        )
    for agent in agents:
        if agent.loop_detection is None:
            continue
        # As in ``AgentsSettings.for_agent``: an agent's block replaces the defaults block.
        merged = merge_loop_blocks(global_block, agent.loop_detection)
        found += check_tiers(merged, f"{agent.path}.tools.loopDetection", agent.label)
        if default_on and not _enabled(merged):
            found.append(
                ConfigWarning(f"{agent.path}.tools.loopDetection", f"{agent.label}: loop detection is off")
            )
    return found


def check_tiers(merged: Mapping[str, Any], path: str, label: str) -> list[ConfigWarning]:
    """Thresholds raised into order, and tiers that can never fire within ``historySize``.

    Detectors count only the newest ``historySize`` records of a run, so a threshold above
    it is never reached: ``historySize: 5`` with thresholds 10/20/30 warns and blocks nothing.
    """
    found = [ConfigWarning(where, f"{label}: {why}") for where, why in raised_thresholds(merged, path)]
    config = resolve_loop_config(merged, None)
    if not config.enabled:
        return found
    tiers = {
        "warningThreshold": config.warning_threshold,
        "criticalThreshold": config.critical_threshold,
        "globalCircuitBreakerThreshold": config.global_circuit_breaker_threshold,
        "unknownToolThreshold": config.unknown_tool_threshold,
    }
    dead = [f"{name} {value}" for name, value in tiers.items() if value > config.history_size]
    if dead:
        # Critical and breaker sit above warning (after the raise): warning dead means all are.
        nothing = (
            " no tier can fire" if config.warning_threshold > config.history_size else " these never fire"
        )
        found.append(
            ConfigWarning(
                f"{path}.historySize",
                f"{label}: historySize {config.history_size} is below {', '.join(dead)}: detectors "
                f"count only the last {config.history_size} calls, so{nothing}",
            )
        )
    return found


def check_tools(tools: Iterable[ToolLimits]) -> list[ConfigWarning]:
    """Tools whose effective soft limit is not below their declared hard limit."""
    return [
        ConfigWarning(
            tool.soft_path,
            f"tool {tool.name!r}: soft limit {tool.soft_s:g}s >= hard limit {tool.hard_s:g}s; "
            "the call is killed without its soft-timeout result",
        )
        for tool in tools
        if tool.hard_s is not None and tool.soft_s >= tool.hard_s
    ]


def check_failure_tools(
    registered: Collection[str], per_tool: Mapping[str, Collection[str]], branches: Mapping[str, str]
) -> list[ConfigWarning]:
    """Fallbacks, retries and fail-branches set for a tool that is not registered, or naming one.

    Args:
        registered: every tool name the workers load.
        per_tool: ``{"tools.fallbacks": names, "tools.retry": names, "tools.failBranch": names}``.
        branches: ``tools.failBranch.<tool>.tool`` per tool.
    """
    found: list[ConfigWarning] = []

    def unknown(name: str) -> str:
        near = closest_key(name, list(registered))
        return f"{name!r} is not a registered tool" + (f"; did you mean {near!r}?" if near else "")

    for block, names in per_tool.items():
        found += [
            ConfigWarning(f"{block}.{name}", unknown(name) + ": this entry is never used")
            for name in sorted(names)
            if name not in registered
        ]
    found += [
        ConfigWarning(f"tools.failBranch.{name}.tool", unknown(branch) + ": the first failure stands")
        for name, branch in sorted(branches.items())
        if branch not in registered
    ]
    return found


def check_lease(lease_ttl_s: float, tools: Iterable[ToolLimits]) -> list[ConfigWarning]:
    """A lease TTL above the shortest tool timeout: a lost worker is noticed after the call's limit."""
    shortest = min(tools, key=lambda tool: tool.soft_s, default=None)
    if shortest is None or lease_ttl_s <= shortest.soft_s:
        return []
    return [
        ConfigWarning(
            "unstuck.lease.ttl_s",
            f"{lease_ttl_s:g}s is above the shortest tool timeout ({shortest.name!r}, "
            f"{shortest.soft_s:g}s): a lost worker is noticed only after that call should have ended",
        )
    ]


def check_builtins(builtins: Sequence[str], allow: Sequence[str], deny: Sequence[str]) -> list[ConfigWarning]:
    """``exec`` enabled with no global allowlist: every agent may run shell commands on workers.

    Args:
        builtins: ``tools.builtins``.
        allow: ``tools.allow``.
        deny: ``tools.deny``.
    """
    if "exec" not in builtins or allow or not ToolRules(deny=tuple(deny)).allows("exec"):
        return []
    return [
        ConfigWarning(
            "tools.builtins",
            "exec (a shell on every worker host) is enabled without tools.allow: any agent may run "
            "any command; list the tools agents may call in tools.allow (agents.list[].tools.allow "
            "narrows it per agent)",
        )
    ]


def check_config(
    *,
    agents: Sequence[AgentLimits],
    global_loop_block: Mapping[str, Any] | None,
    tools: Sequence[ToolLimits],
    lease_ttl_s: float,
    builtins: Sequence[str] = (),
    allow: Sequence[str] = (),
    deny: Sequence[str] = (),
) -> list[ConfigWarning]:
    """Every warning, defaults first.

    Args:
        agents: ``agents.defaults`` first (its ``loop_detection`` is the defaults block),
            then one entry per ``agents.list[]`` item with only the values it sets.
        global_loop_block: ``tools.loopDetection`` as configured.
        tools: every registered or configured tool with its effective limits.
        lease_ttl_s: the worker lease TTL.
        builtins: ``tools.builtins``.
        allow: ``tools.allow``.
        deny: ``tools.deny``.
    """
    found: list[ConfigWarning] = []
    for agent in agents:
        found += check_agent(agent)
    defaults_block = agents[0].loop_detection if agents else None
    found += check_loop_detection(global_loop_block, defaults_block, agents[1:])
    found += check_tools(tools)
    found += check_lease(lease_ttl_s, tools)
    found += check_builtins(builtins, allow, deny)
    return found
