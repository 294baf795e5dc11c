"""The ``{"mcpServers": {...}}`` upstreams file: accepted as hosts write it, refused naming the entry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers.core.mcp_upstreams import RemoteUpstream, StdioUpstream, parse_upstreams, served_name
from workers.errors import ConfigError


def test_a_hosts_block_is_accepted_as_it_is() -> None:
    found = parse_upstreams(
        {
            "mcpServers": {
                "fs": {"command": "npx", "args": ["-y", "server-fs", "/tmp"], "env": {"A": "1"}, "cwd": "/"},
                "api": {"type": "http", "url": "https://example.com/mcp", "headers": {"X": "y"}},
                "slow": {
                    "command": "slow-server",
                    "unstuck": {
                        "soft_timeout_s": 5,
                        "hard_timeout_s": 10,
                        "retry": 2,
                        "tools": {"big": {"soft_timeout_s": 8, "memory_limit_mb": 512}},
                    },
                },
            }
        }
    )
    assert isinstance(found["fs"], StdioUpstream)
    assert found["fs"].describe() == "npx -y server-fs /tmp"
    assert isinstance(found["api"], RemoteUpstream)
    assert found["api"].transport == "streamable-http"
    big = found["slow"].unstuck.for_tool("big")
    assert (big.soft_timeout_s, big.hard_timeout_s, big.memory_limit_mb) == (8, 10, 512)
    assert found["slow"].unstuck.for_tool("other").soft_timeout_s == 5
    policy = big.retry_policy()
    assert policy is not None
    assert policy.attempts == 2
    assert served_name("fs", "read_file") == "fs__read_file"


@pytest.mark.parametrize(
    ("entry", "where", "why"),
    [
        ({"command": "x", "url": "http://a"}, "mcpServers.bad", "exactly one of command"),
        ({"args": ["x"]}, "mcpServers.bad", "exactly one of command"),
        ({"url": "ftp://a"}, "mcpServers.bad.url", "String should match"),
        (
            {"command": "x", "unstuck": {"soft_timeout_s": 5, "hard_timeout_s": 1}},
            "mcpServers.bad.unstuck",
            "greater",
        ),
        ({"command": "x", "unstuck": {"timeout": 5}}, "mcpServers.bad.unstuck.timeout", "Extra inputs"),
        (
            {"command": "x", "unstuck": {"tools": {"t": {"retry": 0}}}},
            "mcpServers.bad.unstuck.tools.t.retry",
            "",
        ),
    ],
)
def test_a_bad_entry_is_refused_by_name(entry: dict[str, object], where: str, why: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_upstreams({"mcpServers": {"good": {"command": "ok"}, "bad": entry}})
    paths = [path for path, _ in raised.value.problems]
    assert any(path.split(": ", 1)[-1].startswith(where) for path in paths), paths
    assert why in str(raised.value)


def test_names_with_the_separator_and_other_shapes_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"mcpServers\.a__b"):
        parse_upstreams({"mcpServers": {"a__b": {"command": "x"}}})
    with pytest.raises(ConfigError, match="mcpServers"):
        parse_upstreams({"servers": {}})


def test_the_docs_example_is_a_valid_upstreams_file() -> None:
    page = (Path(__file__).parents[2] / "docs" / "mcp-upstreams.md").read_text(encoding="utf-8")
    block = page.split("```json\n", 1)[1].split("```", 1)[0]
    found = parse_upstreams(json.loads(block))
    assert sorted(found) == ["browser", "fs", "git", "search"]
    assert found["browser"].unstuck.for_tool("browser_snapshot").memory_limit_mb == 2048
