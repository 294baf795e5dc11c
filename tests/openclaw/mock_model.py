"""A scripted OpenAI-compatible model on loopback (``/v1/chat/completions``, streaming).

The prompt names a plan: steps of tool calls, each step one assistant turn of parallel calls.
The model sends step N once it has seen N-1 of its own tool-calling turns in the messages,
then a final text. Every request body is kept (:attr:`MockModel.requests`): the transcript
OpenClaw sends back is what the checks read. With Tool Search on, the model first asks
``tool_search`` for each tool and then calls it through ``tool_call`` with the id it found.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["LAST_CALL_ID", "MockModel", "Step"]

Step = list[tuple[str, dict[str, Any]]]


@dataclass
class Sent:
    """One tool-calling turn the model sent: when, and the calls (id, tool, arguments)."""

    at: float
    calls: list[tuple[str, str, dict[str, Any]]]


@dataclass
class MockModel:
    """The model server; ``plan`` is what it calls, ``requests`` what it was sent."""

    plan: list[Step] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    received_at: list[float] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    port: int = 0

    def models_config(self) -> dict[str, Any]:
        """OpenClaw's ``models`` block naming this server as provider ``mock``, model ``mock/mock``."""
        entry = {
            "id": "mock",
            "name": "mock",
            "api": "openai-completions",
            "reasoning": False,
            "input": ["text"],
            "contextWindow": 128000,
            "maxTokens": 4000,
        }
        api = "openai-completions"
        provider = {"baseUrl": self.base_url, "apiKey": "mock", "api": api, "models": [entry]}
        return {"mode": "merge", "providers": {"mock": provider}}

    def start(self) -> MockModel:
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                body = json.dumps({"object": "list", "data": [{"id": "mock", "object": "model"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
                chunks = model.answer(request)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                try:
                    for chunk in chunks:
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return  # the gateway aborted a silent request (silent_stream) and hung up: expected

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- the script ---------------------------------------------------------------------------

    def answer(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        self.requests.append(request)
        self.received_at.append(time.monotonic())
        messages = request.get("messages", [])
        tools = [t["function"]["name"] for t in request.get("tools", []) if t.get("type") == "function"]
        turns = [m for m in messages if m.get("role") == "assistant" and m.get("tool_calls")]
        searching = "tool_call" in tools and "tool_search" in tools
        if searching:
            return self._search_then_call(messages, turns)
        step = len(turns)
        if step >= len(self.plan):
            return _text_chunks("done")
        calls = [
            (f"call_{step}_{i}", _direct_name(tool, tools), _resolved(args, messages))
            for i, (tool, args) in enumerate(self.plan[step])
        ]
        self.sent.append(Sent(time.monotonic(), calls))
        return _tool_chunks(calls)

    def _search_then_call(
        self, messages: list[dict[str, Any]], turns: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        # Turns alternate: search for the step's tools, then call them through tool_call.
        step, searched = divmod(len(turns), 2)
        if step >= len(self.plan):
            return _text_chunks("done")
        if searched == 0:
            calls = [
                (f"search_{step}_{i}", "tool_search", {"query": tool, "limit": 5})
                for i, (tool, _) in enumerate(self.plan[step])
            ]
            return _tool_chunks(calls)
        found = _search_results(messages, turns[-1])
        calls = [
            (f"call_{step}_{i}", "tool_call", {"id": hit or tool, "args": _resolved(args, messages)})
            for i, ((tool, args), hit) in enumerate(zip(self.plan[step], found, strict=True))
        ]
        self.sent.append(Sent(time.monotonic(), calls))
        return _tool_chunks(calls)


def _direct_name(tool: str, tools: list[str]) -> str:
    """The name OpenClaw gives an MCP tool (a server prefix), or the bare name if none matches."""
    for name in tools:
        if name == tool or re.fullmatch(r"[A-Za-z0-9]+__" + re.escape(tool), name):
            return name
    return tool


def _search_results(messages: list[dict[str, Any]], turn: dict[str, Any]) -> list[str | None]:
    """The id of each search's exact hit, in the turn's order (None: not found)."""
    texts = {m.get("tool_call_id"): _content_text(m) for m in messages if m.get("role") == "tool"}
    found: list[str | None] = []
    for call in turn["tool_calls"]:
        query = json.loads(call["function"]["arguments"])["query"]
        ids = re.findall(r'"id"\s*:\s*"([^"]+)"', texts.get(call["id"], ""))
        exact = [i for i in ids if i.rsplit(":", 1)[-1].split("__")[-1] == query]
        found.append(exact[0] if exact else None)
    return found


LAST_CALL_ID = "$LAST_CALL_ID"


def _resolved(args: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """``args`` with :data:`LAST_CALL_ID` replaced by the call id the last tool result named."""
    if LAST_CALL_ID not in args.values():
        return args
    tool_texts = [_content_text(m) for m in messages if m.get("role") == "tool"]
    # The newest result naming a call id (with Tool Search it is escaped JSON inside a notice).
    named = [hit for text in reversed(tool_texts) for hit in re.findall(r"call_id\W+(mcp-[0-9a-f]+)", text)]
    return {
        key: (named[0] if named else "?") if value == LAST_CALL_ID else value for key, value in args.items()
    }


def _content_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content or "")


def _base(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-mock",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "mock",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _text_chunks(text: str) -> list[dict[str, Any]]:
    return [_base({"role": "assistant", "content": text}), _base({}, "stop")]


def _tool_chunks(calls: list[tuple[str, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    deltas = [
        {
            "index": i,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        }
        for i, (call_id, name, args) in enumerate(calls)
    ]
    return [_base({"role": "assistant", "content": None, "tool_calls": deltas}), _base({}, "tool_calls")]
