"""``unstuck openclaw doctor``: the OpenClaw settings that leave sessions exposed, each with its fix.

OpenClaw 2026.9.6's defaults, as its own docs give them: an agent run may last 48 h
(``agents.defaults.timeoutSeconds`` 172800), a model stream may stay silent 120 s (cloud) or
300 s (self-hosted) before OpenClaw aborts it (``models.providers.<id>.timeoutSeconds``),
loop detection is off (``tools.loopDetection.enabled``), ``tools.exec.timeoutSeconds`` 0 turns
the exec timeout off, and an MCP server's ``requestTimeoutMs`` defaults to 60 000.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MODEL_IDLE_S", "RUN_TIMEOUT_S", "Finding", "doctor_findings"]

RUN_TIMEOUT_S = 1800  # what the tier-1 advice sets instead of 48 h
MODEL_IDLE_S = 90
_DEFAULT_RUN_TIMEOUT_S = 172800
_DEFAULT_MCP_TIMEOUT_MS = 60000


@dataclass(frozen=True)
class Finding:
    """One exposed setting: where, what it leaves open, and the fix."""

    setting: str
    problem: str
    fix: str


def _at(config: Mapping[str, Any], *path: str) -> Any:
    node: Any = config
    for part in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def doctor_findings(config: Mapping[str, Any], *, mcp_client_timeout_s: float) -> list[Finding]:
    """Every exposed setting of an OpenClaw config (parsed JSON5), in a fixed order."""
    return [
        *_run_timeout(config),
        *_model_idle(config),
        *_loop_detection(config),
        *_exec_timeout(config),
        *_mcp_timeouts(config, mcp_client_timeout_s),
        *_plugin(config),
    ]


def _run_timeout(config: Mapping[str, Any]) -> Iterator[Finding]:
    value = _at(config, "agents", "defaults", "timeoutSeconds")
    seconds = _DEFAULT_RUN_TIMEOUT_S if value is None else value
    if not isinstance(seconds, int | float) or seconds == 0 or seconds > RUN_TIMEOUT_S:
        shown = "unset (48 h)" if value is None else "0 (unlimited)" if seconds == 0 else f"{value} s"
        yield Finding(
            "agents.defaults.timeoutSeconds",
            f"{shown}: a stuck run holds its session that long",
            f"agents: {{ defaults: {{ timeoutSeconds: {RUN_TIMEOUT_S} }} }}",
        )


def _model_idle(config: Mapping[str, Any]) -> Iterator[Finding]:
    providers = _at(config, "models", "providers")
    for name, provider in sorted((providers or {}).items()) if isinstance(providers, Mapping) else []:
        value = provider.get("timeoutSeconds") if isinstance(provider, Mapping) else None
        if value is None or not isinstance(value, int | float) or value > MODEL_IDLE_S:
            shown = "unset (120 s cloud, 300 s self-hosted)" if value is None else f"{value} s"
            yield Finding(
                f"models.providers.{name}.timeoutSeconds",
                f"{shown}: a silent model stream stalls the session that long",
                f"models: {{ providers: {{ {name}: {{ timeoutSeconds: {MODEL_IDLE_S} }} }} }}",
            )


def _loop_detection(config: Mapping[str, Any]) -> Iterator[Finding]:
    if _at(config, "tools", "loopDetection", "enabled") is not True:
        yield Finding(
            "tools.loopDetection.enabled",
            "off: identical calls repeat until the run's timeout",
            "tools: { loopDetection: { enabled: true } }",
        )


def _exec_timeout(config: Mapping[str, Any]) -> Iterator[Finding]:
    if _at(config, "tools", "exec", "timeoutSeconds") == 0:
        yield Finding(
            "tools.exec.timeoutSeconds",
            "0: an exec command that hangs is never ended by OpenClaw",
            "tools: { exec: { timeoutSeconds: 1800 } } (and keep the unstuck plugin's exec budget)",
        )


def _mcp_timeouts(config: Mapping[str, Any], client_timeout_s: float) -> Iterator[Finding]:
    servers = _at(config, "mcp", "servers")
    for name, server in sorted(servers.items()) if isinstance(servers, Mapping) else []:
        value = (
            server.get("requestTimeoutMs", _DEFAULT_MCP_TIMEOUT_MS) if isinstance(server, Mapping) else None
        )
        if isinstance(value, int | float) and value < client_timeout_s * 1000:
            yield Finding(
                f"mcp.servers.{name}.requestTimeoutMs",
                f"{value:g} ms, below unstuck's mcp.client_timeout_s ({client_timeout_s:g} s): OpenClaw "
                "answers -32001 itself before unstuck's answer",
                f"requestTimeoutMs: {int(client_timeout_s * 1000)}, or lower mcp.client_timeout_s to match",
            )


def _plugin(config: Mapping[str, Any]) -> Iterator[Finding]:
    entry = _at(config, "plugins", "entries", "unstuck")
    url = _at(entry, "config", "url") if isinstance(entry, Mapping) else None
    if not isinstance(entry, Mapping) or entry.get("enabled") is not True or not url:
        yield Finding(
            "plugins.entries.unstuck",
            "the unstuck plugin is missing, disabled or has no url: OpenClaw's own tools are unguarded",
            'plugins: { load: { paths: ["<unstuck>/integrations/openclaw"] }, entries: { unstuck: '
            '{ enabled: true, config: { url: "http://127.0.0.1:8765" } } } }',
        )
