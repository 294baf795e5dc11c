"""A stdio door that could not start answers every request with the reason, and nothing else."""

from __future__ import annotations

import io
import json

import pytest

from workers.cli.main import build_parser
from workers.cli.mcp_cmd import settings_overrides
from workers.servers.mcp_startup_error import NOT_STARTED, refusal_for, refuse_stdio

INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}})


def test_initialize_is_answered_with_the_reason() -> None:
    reply = refusal_for(INITIALIZE, "cannot reach Redis at redis://x:1/0")
    assert reply is not None
    assert json.loads(reply) == {
        "jsonrpc": "2.0",
        "id": 0,
        "error": {
            "code": NOT_STARTED,
            "message": "unstuck mcp did not start: cannot reach Redis at redis://x:1/0",
            "data": {"reason": "cannot reach Redis at redis://x:1/0"},
        },
    }


@pytest.mark.parametrize(
    "line",
    [
        "",
        "  \n",
        json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json.dumps({"jsonrpc": "2.0", "id": 3, "result": {}}),
        json.dumps([INITIALIZE]),
    ],
)
def test_notifications_responses_and_blank_lines_get_no_reply(line: str) -> None:
    assert refusal_for(line, "r") is None


def test_a_line_that_is_not_json_is_answered_with_a_null_id() -> None:
    reply = refusal_for("{not json", "r")
    assert reply is not None
    assert json.loads(reply)["id"] is None


def test_every_request_is_answered_until_stdin_closes() -> None:
    lines = [
        INITIALIZE,
        json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json.dumps({"jsonrpc": "2.0", "id": "b", "method": "tools/list"}),
    ]
    out = io.StringIO()
    refuse_stdio("why", io.StringIO("\n".join(lines) + "\n"), out)
    assert [json.loads(line)["id"] for line in out.getvalue().splitlines()] == [0, "b"]


def test_the_command_line_gives_modules_config_and_redis() -> None:
    modules = ["--tool-modules", "a, b", "--tool-modules", "c"]
    others = ["--config", "/etc/u.json5", "--redis-url", "redis://h:1/2", "--path", "/x", "--path", "/y"]
    args = build_parser().parse_args(["mcp", "--stdio", *modules, *others])
    assert settings_overrides(args) == {
        "tool_modules": ("a", "b", "c"),
        "config": "/etc/u.json5",
        "redis": {"url": "redis://h:1/2"},
    }
    assert args.path == ["/x", "/y"]


def test_without_arguments_the_environment_decides() -> None:
    assert settings_overrides(build_parser().parse_args(["mcp", "--stdio"])) == {}
