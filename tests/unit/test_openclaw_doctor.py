"""``unstuck openclaw doctor``: each exposed OpenClaw setting is named with its fix."""

from __future__ import annotations

from typing import Any

from workers.core.openclaw_doctor import doctor_findings

GUARDED: dict[str, Any] = {
    "agents": {"defaults": {"timeoutSeconds": 1800}},
    "models": {"providers": {"openai": {"timeoutSeconds": 90}}},
    "tools": {"loopDetection": {"enabled": True}, "exec": {"timeoutSeconds": 1800}},
    "mcp": {"servers": {"unstuck": {"url": "http://127.0.0.1:8766/mcp", "requestTimeoutMs": 60000}}},
    "plugins": {"entries": {"unstuck": {"enabled": True, "config": {"url": "http://127.0.0.1:8765"}}}},
}


def _settings(config: dict[str, Any]) -> list[str]:
    return [f.setting for f in doctor_findings(config, mcp_client_timeout_s=60)]


def test_a_guarded_config_has_no_finding() -> None:
    assert _settings(GUARDED) == []


def test_an_empty_config_is_exposed_everywhere_openclaw_defaults_are() -> None:
    # OpenClaw's defaults: 48 h runs, loop detection off, no plugin (no provider, no MCP server)
    assert _settings({}) == [
        "agents.defaults.timeoutSeconds",
        "tools.loopDetection.enabled",
        "plugins.entries.unstuck",
    ]


def test_each_exposed_setting_is_named_with_its_fix() -> None:
    exposed = {
        "agents": {"defaults": {"timeoutSeconds": 0}},
        "models": {"providers": {"local": {}}},
        "tools": {"loopDetection": {"enabled": False}, "exec": {"timeoutSeconds": 0}},
        "mcp": {"servers": {"slow": {"command": "x", "requestTimeoutMs": 8000}, "default": {"command": "y"}}},
        "plugins": {"entries": {"unstuck": {"enabled": True, "config": {}}}},
    }
    findings = doctor_findings(exposed, mcp_client_timeout_s=60)
    assert [f.setting for f in findings] == [
        "agents.defaults.timeoutSeconds",
        "models.providers.local.timeoutSeconds",
        "tools.loopDetection.enabled",
        "tools.exec.timeoutSeconds",
        "mcp.servers.slow.requestTimeoutMs",
        "plugins.entries.unstuck",
    ]
    assert "0 (unlimited)" in findings[0].problem
    assert "1800" in findings[0].fix
    assert "8000 ms" in findings[4].problem
    assert "60000" in findings[4].fix
