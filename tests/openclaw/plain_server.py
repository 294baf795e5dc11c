"""The comparison: the same misbehaving tools on a plain MCP server (the ``mcp`` SDK, no unstuck).

``python -m tests.openclaw.plain_server stdio`` or ``... http PORT``. The tools do what
``tests.misbehaving_tools`` does, but nothing answers for them: a hung tool hangs the request,
a crash takes the server down.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("plain")


@server.tool()
def echo(text: str, times: int = 1) -> str:
    """Healthy tool."""
    return text * times


@server.tool()
def stubborn(seconds: float) -> str:
    """Hangs for ``seconds`` (a hung tool)."""
    time.sleep(seconds)
    return "woke up"


@server.tool()
def sleepy(seconds: float) -> str:
    """Sleeps."""
    time.sleep(seconds)
    return "slept"


@server.tool()
def slow(seconds: float) -> str:
    """Takes a while."""
    time.sleep(seconds)
    return "slow done"


@server.tool()
def hog(seconds: float) -> str:
    """Takes a long while."""
    time.sleep(seconds)
    return "hog done"


@server.tool()
def crash(how: str = "sigkill") -> str:
    """Kills its own process."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


def main() -> None:
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))


if __name__ == "__main__":
    main()
