"""A stdio MCP server that could not start, telling its host why instead of just closing.

Hosts show a server that exits before its handshake as a bare closed connection (OpenClaw:
``MCP error -32000: Connection closed``), whatever the server printed on stderr. So when
``unstuck mcp --stdio`` cannot start (bad settings, a tool module that does not import, Redis
unreachable) it stays on stdin/stdout and answers every request, ``initialize`` first, with a
JSON-RPC error carrying the real reason, until the host closes stdin.

:func:`refusal_for` is pure (one line in, the reply line out); :func:`refuse_stdio` is its I/O.
"""

from __future__ import annotations

import json
from typing import Final, TextIO

__all__ = ["NOT_STARTED", "refusal_for", "refuse_stdio"]

NOT_STARTED: Final = -32603  # JSON-RPC "internal error": the server, not the request, is at fault


def refusal_for(line: str, reason: str) -> str | None:
    """The JSON-RPC error line answering ``line``, or None for a notification or an empty line.

    A line that is not JSON is answered too (``id`` null), as JSON-RPC asks of a parse error.
    """
    if not line.strip():
        return None
    try:
        message = json.loads(line)
    except ValueError:
        message = {"id": None, "method": "?"}
    if not isinstance(message, dict) or "method" not in message:
        return None  # a response or a batch from the host: nothing to answer
    if "id" not in message:
        return None  # a notification never gets a reply
    error = {
        "code": NOT_STARTED,
        "message": f"unstuck mcp did not start: {reason}",
        "data": {"reason": reason},
    }
    return json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error})


def refuse_stdio(reason: str, stdin: TextIO, stdout: TextIO) -> None:
    """Answer every request on ``stdin`` with the refusal, until the host closes it."""
    for line in stdin:
        reply = refusal_for(line, reason)
        if reply is not None:
            stdout.write(reply + "\n")
            stdout.flush()
