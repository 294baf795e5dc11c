"""A stateful MCP upstream's calls go to its own queue, which its own one-child worker serves."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import BaseModel

from workers.celery_edge.app import create_app
from workers.cli.launch import preflight, worker_argv
from workers.core.mcp_upstreams import parse_upstreams, served_upstream, upstream_queue
from workers.core.models import ToolCall
from workers.errors import ConfigError
from workers.gateway.dispatching import Dispatcher
from workers.local import up
from workers.settings import Settings
from workers.store.keys import RunKeys
from workers.tools.registry import ToolSpec, register_spec

SETTINGS = Settings(redis={"url": "redis://127.0.0.1:1/0"})


class _Any(BaseModel):
    pass


def _tool(name: str, stateful_upstream: str | None) -> None:
    register_spec(
        ToolSpec(
            name=name,
            func=lambda arguments, ctx: "",
            arguments_model=_Any,
            wants_context=True,
            input_schema={"type": "object"},
            stateful_upstream=stateful_upstream,
        )
    )


def _queue_of(dispatcher: Dispatcher, tool: str) -> tuple[str, str]:
    submission = dispatcher.plan(RunKeys("t", "s", "r"), "agent", ToolCall(id="c1", name=tool), 1_000, None)
    assert submission.push is not None  # built here and pushed by the register script
    routing = json.loads(submission.push[1])["properties"]["delivery_info"]["routing_key"]
    return submission.options.queue, routing


def test_a_stateful_upstreams_calls_go_to_its_own_queue_and_the_others_to_the_tool_queue() -> None:
    _tool("mem__count", "mem")
    _tool("plain__count", None)
    ledger: Any = SimpleNamespace()
    dispatcher = Dispatcher(SETTINGS, ledger, create_app(SETTINGS, role="client"), "gateway", lambda: 1_000)
    assert _queue_of(dispatcher, "mem__count") == ("unstuck.tools.mcp.mem", "unstuck.tools.mcp.mem")
    assert _queue_of(dispatcher, "plain__count") == ("unstuck.tools", "unstuck.tools")


def test_the_stateful_mark_is_the_entrys_and_no_tools_limit() -> None:
    found = parse_upstreams({"mcpServers": {"mem": {"command": "x", "unstuck": {"stateful": True}}}})
    assert found["mem"].unstuck.stateful is True
    assert found["mem"].unstuck.for_tool("count").soft_timeout_s is None
    with pytest.raises(ConfigError, match=r"tools\.count\.stateful"):
        parse_upstreams(
            {"mcpServers": {"m": {"command": "x", "unstuck": {"tools": {"count": {"stateful": True}}}}}}
        )
    assert upstream_queue("unstuck.tools", "mem") == "unstuck.tools.mcp.mem"
    # A worker's pool children know which stateful upstream they serve from its queues
    assert served_upstream("unstuck.tools", ["unstuck.tools.mcp.mem"]) == "mem"
    assert served_upstream("unstuck.tools", ["unstuck.tools"]) == ""


def test_an_upstreams_worker_takes_its_queue_with_one_pool_child() -> None:
    argv = worker_argv(SETTINGS, concurrency=4, hostname="w@h", loglevel="INFO", upstream="mem")
    assert argv[argv.index("--queues") + 1] == "unstuck.tools.mcp.mem"
    assert argv[argv.index("--concurrency") + 1] == "1"


def test_a_worker_for_an_upstream_that_is_not_stateful_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "plain": {"command": "x"},
                    "mem": {"command": "y", "unstuck": {"stateful": True}},
                }
            }
        )
    )
    settings = Settings(redis={"url": "redis://127.0.0.1:1/0"}, mcp={"upstreams_file": str(path)})
    why = r"--upstream: 'plain' is no stateful MCP upstream \(stateful ones: \['mem'\]\)"
    with pytest.raises(ConfigError, match=why):
        preflight(settings, upstream="plain")


def test_unstuck_up_starts_one_worker_for_each_stateful_upstream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "mcp.json"
    servers = {"plain": {"command": "x"}, "mem": {"command": "y", "unstuck": {"stateful": True}}}
    path.write_text(json.dumps({"mcpServers": servers}))
    settings = Settings(redis={"url": "redis://127.0.0.1:1/0"}, mcp={"upstreams_file": str(path)})
    spawned: dict[str, tuple[list[str], Mapping[str, str]]] = {}

    def spawn(name: str, argv: list[str], env: Mapping[str, str], log_dir: Path) -> Any:
        spawned[name] = (argv, env)
        return SimpleNamespace(wait_for_log=lambda *_, **__: None)

    monkeypatch.setattr(up.Child, "spawn", spawn)
    stack = up.Stack(settings, up.StackOptions(serve_port=None), log_dir=tmp_path)
    monkeypatch.setattr(stack, "_start_redis", lambda: None)
    monkeypatch.setattr(stack, "_preflight", lambda: None)
    stack.start()
    argv, _ = spawned["worker-mcp-mem"]
    assert argv[argv.index("--queues") + 1] == "unstuck.tools.mcp.mem"
    assert not [name for name in spawned if name.endswith("plain")]
    assert len(stack.children()) == len(spawned)
