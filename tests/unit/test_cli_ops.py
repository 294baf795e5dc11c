"""Operator commands: ``config show|check``, ``metrics`` and ``flower`` argument handling."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from workers.cli.flower_cmd import BASIC_AUTH_ENV, flower_argv, flower_env, is_loopback
from workers.cli.main import main
from workers.core.redact import mask_setting_url
from workers.errors import ConfigError
from workers.tools import registry


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("UNSTUCK_", "FLOWER_")):
            monkeypatch.delenv(name)


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    # The tool registry is process-wide: tools other test tiers imported (e.g. the 1 s
    # misbehaving ones) must not change what `config check` warns about here.
    builtins = {
        name: spec for name, spec in registry._REGISTRY.items() if spec.func.__module__.startswith("workers.")
    }
    monkeypatch.setattr(registry, "_REGISTRY", builtins)

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
    assert mask_setting_url(url) == expected


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
    # Given OpenClaw's risky defaults: 48 h runs, loop detection off, a 3 s tool
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


def test_config_check_names_each_missing_production_safeguard(
    config_file: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a safe config on a remote Redis without password or TLS, and exec without an allowlist
    config_file({**SAFE, "tools": {**SAFE["tools"], "builtins": ["exec"]}})
    monkeypatch.setenv("UNSTUCK_REDIS__URL", "redis://redis.internal:6379/0")
    # When checked
    assert main(["config", "check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # Then the missing ACL user, TLS, signing and allowlist are each one warning, and the
    # Redis that cannot be reached to read its replication and persistence one more
    assert [line.split(":")[1].strip() for line in lines[:-1]] == [
        "unstuck.redis.url",
        "unstuck.redis.url",
        "unstuck.broker.signing",
        "tools.builtins",
        "unstuck.redis.url",
    ]
    assert "could not read the Redis's replication and persistence" in lines[-2]
    assert lines[-1] == "5 warning(s)"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"agents": {"defaults": {"timeoutSeconds": -1}}}, "agents.defaults.timeoutSeconds"),
        ({"tools": {"loopDetection": {"enabled": True, "bogus": 1}}}, "tools.loopDetection.bogus"),
        (
            {"tools": {"loopDetection": {"enabled": True, "historySise": 5}}},
            "tools.loopDetection.historySise: unknown key; did you mean 'historySize'?",
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


# --- metrics ---------------------------------------------------------------------------------


def test_metrics_requires_a_port(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["metrics"])
    assert raised.value.code == 2
    assert "--port" in capsys.readouterr().err


def test_metrics_without_redis_url_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["metrics", "--port", "0"]) == 2
    assert "no Redis URL configured" in capsys.readouterr().err


# --- flower ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("", False),
        ("::", False),
        ("10.0.0.5", False),
        ("flower.example.com", False),
    ],
)
def test_is_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_flower_argv_targets_our_app_without_credentials() -> None:
    argv = flower_argv(5555, "127.0.0.1")
    assert argv[1:] == [
        "-m", "celery", "-A", "workers.celery_edge.app", "flower",
        "--tasks_columns=name,uuid,state,exception,result,received,runtime,worker",
        "--port=5555", "--address=127.0.0.1",
    ]  # fmt: skip


def test_flower_env_passes_the_flag_credentials_through_the_environment() -> None:
    env = flower_env("0.0.0.0", "ops:s3cret", {"PATH": "/bin"})
    assert env == {"PATH": "/bin", BASIC_AUTH_ENV: "ops:s3cret"}


def test_flower_env_takes_credentials_from_flower_basic_auth() -> None:
    env = flower_env("0.0.0.0", None, {BASIC_AUTH_ENV: "a:b,c:d"})
    assert env[BASIC_AUTH_ENV] == "a:b,c:d"


def test_flower_env_on_loopback_needs_no_credentials() -> None:
    assert flower_env("127.0.0.1", None, {"PATH": "/bin"}) == {"PATH": "/bin"}


@pytest.mark.parametrize("auth", ["ops", "ops:", ":pw", "a:b,broken"])
def test_flower_env_refuses_malformed_credentials(auth: str) -> None:
    with pytest.raises(ConfigError, match="must be USER:PASS") as raised:
        flower_env("127.0.0.1", auth, {})
    assert "pw" not in str(raised.value)


def test_flower_refuses_public_address_without_auth(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a configured broker and no credentials anywhere
    monkeypatch.setenv("UNSTUCK_REDIS__URL", "redis://127.0.0.1:1/0")
    monkeypatch.setattr(os, "execve", _no_exec)
    # When Flower is asked to listen on every interface
    code = main(["flower", "--address", "0.0.0.0"])
    # Then it refuses with one line and exit 2
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert "0.0.0.0 is not loopback" in err
    assert BASIC_AUTH_ENV in err


def test_flower_execs_celery_flower_with_credentials_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a configured broker
    monkeypatch.setenv("UNSTUCK_REDIS__URL", "redis://127.0.0.1:1/0")
    calls: list[tuple[str, list[str], dict[str, str]]] = []

    def fake_execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        calls.append((path, argv, env))

    monkeypatch.setattr(os, "execve", fake_execve)
    # When started on a public address with basic auth
    assert main(["flower", "--address", "0.0.0.0", "--port", "5600", "--basic-auth", "ops:s3cret"]) == 0
    # Then celery flower is exec'd, the password only in its environment
    ((path, argv, env),) = calls
    assert argv[0] == path
    assert argv[-2:] == ["--port=5600", "--address=0.0.0.0"]
    assert not any("s3cret" in part for part in argv)
    assert env[BASIC_AUTH_ENV] == "ops:s3cret"
    assert env["UNSTUCK_REDIS__URL"] == "redis://127.0.0.1:1/0"


def test_flower_without_broker_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "execve", _no_exec)
    assert main(["flower"]) == 2
    assert "no broker configured" in capsys.readouterr().err


def _no_exec(*args: object) -> None:
    raise AssertionError("must not exec")


def test_config_check_accepts_the_reference_json5_and_warns_about_unreachable_tiers_and_raises(
    config_file: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given OpenClaw's JSON5, with historySize 5 and a misordered triple
    path = config_file({})
    path.write_text(
        """{
          // comments, trailing commas and unquoted keys, as OpenClaw writes them
          agents: { defaults: { llm: { idleTimeoutSeconds: 60, }, }, },
          tools: {
            loopDetection: { enabled: true, historySize: 5, warningThreshold: 10, criticalThreshold: 10, },
            fallbacks: { no_such_tool: { value: 1 } },
          },
        }""",
        encoding="utf-8",
    )
    # When checked / Then it passes with the warnings, each naming its key
    assert main(["config", "check"]) == 0
    out = capsys.readouterr().out
    assert (
        "tools.loopDetection.criticalThreshold: defaults: 10 is not above warningThreshold; raised to 11"
        in out
    )
    assert "tools.loopDetection.historySize: defaults: historySize 5 is below warningThreshold 10" in out
    assert "no tier can fire" in out
    assert "tools.fallbacks.no_such_tool: 'no_such_tool' is not a registered tool" in out
