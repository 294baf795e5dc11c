"""Operator commands: ``config show|check``, ``metrics`` and ``flower`` argument handling."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from workers.cli.config_cmd import redact_url
from workers.cli.main import main


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("UNSTUCK_", "FLOWER_")):
            monkeypatch.delenv(name)


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    def write(data: dict[str, Any]) -> Path:
        path = tmp_path / "unstuck.json"
        path.write_text(json.dumps(data), encoding="utf-8")
        monkeypatch.setenv("UNSTUCK_CONFIG", str(path))
        return path

    return write


SAFE = {"tools": {"loopDetection": {"enabled": True}}}


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://:hunter2@db:6379/0", "redis://:****@db:6379/0"),
        ("redis://user:hunter2@db:6379/0", "redis://user:****@db:6379/0"),
        ("https://tok3n@hooks.example/x", "https://:****@hooks.example/x"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("https://h.example/p?token=abc&x=1", "https://h.example/p?token=****&x=1"),
        ("unstuck.tools", "unstuck.tools"),
        ("", ""),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_config_show_json_redacts_secrets(config_file: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # Given a config with a password in the Redis URL and a secret webhook
    config_file(
        {
            "unstuck": {
                "redis": {"url": "redis://:hunter2@db.example:6379/0"},
                "watchdog": {"webhook_url": "https://hooks.example/services/T0/SECRET"},
            }
        }
    )
    # When the effective config is shown
    assert main(["config", "show", "--json"]) == 0
    out = capsys.readouterr().out
    shown = json.loads(out)
    # Then the secrets are gone and the rest is there
    assert "hunter2" not in out
    assert "SECRET" not in out
    assert shown["redis"]["url"] == "redis://:****@db.example:6379/0"
    assert shown["watchdog"]["webhook_url"] == "https://hooks.example/****"
    assert shown["agents"]["defaults"]["run_timeout_s"] == 1800.0


def test_config_show_agent_gives_its_merged_profile(
    config_file: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file(
        {
            "agents": {
                "defaults": {"timeoutSeconds": 900, "llm": {"idleTimeoutSeconds": 60}},
                "list": [
                    {"id": "coder", "timeoutSeconds": 1200, "tools": {"loopDetection": {"enabled": True}}}
                ],
            },
            "tools": {"loopDetection": {"warningThreshold": 4, "criticalThreshold": 8}},
        }
    )
    assert main(["config", "show", "--agent", "coder", "--json"]) == 0
    agent = json.loads(capsys.readouterr().out)["agent"]
    assert agent["listed"] is True
    assert agent["run_timeout_s"] == 1200.0
    assert agent["llm"]["idle_timeout_s"] == 60.0
    assert agent["loop_detection_resolved"]["enabled"] is True
    assert agent["loop_detection_resolved"]["warning_threshold"] == 4


def test_config_show_unknown_agent_notes_defaults(
    config_file: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file(SAFE)
    assert main(["config", "show", "--agent", "nobody"]) == 0
    captured = capsys.readouterr()
    assert "agent.run_timeout_s = 1800.0" in captured.out.splitlines()
    assert "no agents.list entry" in captured.err


def test_config_check_clean(config_file: Any, capsys: pytest.CaptureFixture[str]) -> None:
    config_file(SAFE)
    assert main(["config", "check"]) == 0
    assert capsys.readouterr().out.strip() == "config ok: no risky settings found"


def test_config_check_prints_warnings_and_exits_zero(
    config_file: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given the reference system's risky defaults: 48 h runs, loop detection off, a 3 s tool
    config_file({"agents": {"defaults": {"timeoutSeconds": 172800}}, "tools": {"timeouts": {"exec": 3}}})
    # When checked
    assert main(["config", "check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # Then each risk is one warning line naming its key path
    assert [line.split(":")[1].strip() for line in lines[:-1]] == [
        "agents.defaults.timeoutSeconds",
        "tools.loopDetection",
        "unstuck.lease.ttl_s",
    ]
    assert lines[-1] == "3 warning(s)"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"agents": {"defaults": {"timeoutSeconds": -1}}}, "agents.defaults.timeoutSeconds"),
        ({"tools": {"loopDetection": {"enabled": True, "bogus": 1}}}, "tools.loopDetection.bogus"),
        (
            {"tools": {"loopDetection": {"warningThreshold": 30, "criticalThreshold": 20}}},
            "tools.loopDetection: Value error, warningThreshold must be lower than criticalThreshold",
        ),
        (
            {"agents": {"list": [{"id": "a", "tools": {"loopDetection": {"historySize": 0}}}]}},
            "agents.list[0].tools.loopDetection.historySize",
        ),
    ],
)
def test_config_check_invalid_exits_2_without_traceback(
    config: dict[str, Any], expected: str, config_file: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file(config)
    assert main(["config", "check"]) == 2
    captured = capsys.readouterr()
    assert expected in captured.err
    assert "Traceback" not in captured.err
    assert captured.out == ""
