"""``unstuck mcp --stdio`` under a host that strips the environment (OpenClaw drops PYTHONPATH).

The server gets only PATH and HOME; everything else comes from its arguments. When it cannot
start, the host's ``initialize`` is answered with the reason, never just a closed connection.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from pathlib import Path

import pytest
from mcp import Client, MCPError
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.harness import UNSTUCK

TOOL_MODULE = '''
from workers.tools import tool


@tool(soft_timeout_s=5.0)
def only_in_tmp(text: str) -> str:
    """A tool found through --path alone."""
    return text
'''


def _stripped_env(home: Path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(home)}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _server(home: Path, *args: str) -> StdioServerParameters:
    return StdioServerParameters(command=UNSTUCK, args=["mcp", "--stdio", *args], env=_stripped_env(home))


async def _initialize_error(server: StdioServerParameters) -> tuple[str, str]:
    """The error the server answers ``initialize`` with, and what it printed on stderr."""
    with tempfile.TemporaryFile("w+") as errlog:
        with pytest.raises(BaseExceptionGroup) as caught:  # the SDK wraps it in a group
            async with Client(stdio_client(server, errlog=errlog), mode="legacy"):
                pass
        errlog.seek(0)
        return str(_mcp_error(caught.value)), errlog.read()


def _mcp_error(exc: BaseException) -> MCPError:
    if isinstance(exc, MCPError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            with contextlib.suppress(AssertionError):
                return _mcp_error(inner)
    raise AssertionError(f"no MCP error in {exc!r}")


@pytest.mark.timeout(60)
async def test_arguments_alone_bring_the_tools_and_redis(tmp_path: Path, redis_url: str) -> None:
    # Given a tool module in a directory no environment variable names
    (tmp_path / "tmp_tools.py").write_text(TOOL_MODULE)
    server = _server(
        tmp_path, "--path", str(tmp_path), "--tool-modules", "tmp_tools", "--redis-url", redis_url
    )
    # When a host with a stripped environment starts the server and lists its tools
    with tempfile.TemporaryFile("w+") as errlog:
        async with Client(stdio_client(server, errlog=errlog), mode="legacy") as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    # Then the tool from --path is served with its schema
    assert tools["only_in_tmp"].input_schema["required"] == ["text"]


@pytest.mark.timeout(60)
async def test_a_tool_module_that_does_not_import_is_the_initialize_error(tmp_path: Path) -> None:
    error, stderr = await _initialize_error(_server(tmp_path, "--tool-modules", "no_such_tools_module"))
    assert "unstuck mcp did not start" in error
    assert "No module named 'no_such_tools_module'" in error
    assert "No module named 'no_such_tools_module'" in stderr


@pytest.mark.timeout(60)
async def test_unreachable_redis_is_the_initialize_error(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    error, stderr = await _initialize_error(_server(tmp_path, "--redis-url", url))
    assert "cannot reach Redis" in error
    assert "cannot reach Redis" in stderr


@pytest.mark.timeout(60)
async def test_a_missing_path_and_a_bad_config_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    error, _ = await _initialize_error(_server(tmp_path, "--path", str(missing)))
    assert f"--path {missing}: no such directory" in error
    broken = tmp_path / "broken.json5"
    broken.write_text("{ unstuck: { redis: { nope: 1 } } }")
    error, _ = await _initialize_error(_server(tmp_path, "--config", str(broken)))
    assert "nope" in error
