"""OpenClaw reaches ``@modelcontextprotocol/server-everything`` through unstuck.

server-everything is an upstream of unstuck's MCP door (``mcp.upstreams_file``), and OpenClaw
has only the door in its ``mcp.servers``. One ``openclaw agent exec`` turn, with the scripted
model of :mod:`tests.openclaw.mock_model`, calls server-everything's ``echo``, ``get-sum``,
``trigger-long-running-operation`` (progress) and ``simulate-research-query`` (a tool the
upstream serves only as an MCP task): each tool_call gets exactly one result, the upstream's,
the same text as the ledger's.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_mcp_upstreams_e2e import EVERYTHING, NPM_DIR
from tests.harness import base_env, start_worker
from tests.openclaw.mock_model import MockModel, Step
from tests.openclaw.test_openclaw import (
    CLIENT_TIMEOUT_S,
    OPENCLAW,
    Backbone,
    _calling_turns,
    _config,
    _door_env,
    _ledger_texts,
    _results,
    _run_openclaw,
    _start_door,
    _timeout_fields,
)
from workers.local.embedded_redis import EmbeddedRedis

pytestmark = pytest.mark.skipif(not OPENCLAW, reason="make test-openclaw installs OpenClaw and sets its path")

PLAN: list[Step] = [
    [("everything__echo", {"message": "through unstuck"})],
    [("everything__get-sum", {"a": 2, "b": 3})],
    [("everything__trigger-long-running-operation", {"duration": 1, "steps": 2})],
    [("everything__simulate-research-query", {"topic": "unstuck"})],
]
EXPECTED = ["Echo: through unstuck", "5", "Long running operation completed", "Research Report: unstuck"]


@pytest.fixture(scope="module")
def everything_behind_unstuck(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backbone]:
    """A private Redis, a tool worker and the door, with server-everything as their upstream."""
    if not EVERYTHING.is_file():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NPM_DIR, check=True, timeout=300)
    tmp = tmp_path_factory.mktemp("openclaw-upstreams")
    (tmp / "tmp").mkdir()
    upstreams = tmp / "upstreams.json"
    servers = {"everything": {"command": "node", "args": [str(EVERYTHING), "stdio"]}}
    upstreams.write_text(json.dumps({"mcpServers": servers}))
    redis = EmbeddedRedis().start()
    env = base_env(
        redis.url,
        UNSTUCK_TOOL_MODULES="",
        UNSTUCK_MCP__UPSTREAMS_FILE=str(upstreams),
        TMPDIR=str(tmp / "tmp"),  # the upstreams' reaper notes: this stack's own
    )
    worker = start_worker(env, concurrency=2, name="openclaw-upstreams")
    door, url = _start_door(_door_env(env, CLIENT_TIMEOUT_S), "mcp-openclaw-upstreams")
    yield Backbone(env, redis.url, url)
    door.stop()
    worker.stop()
    redis.close()


@pytest.mark.timeout(600)
def test_openclaw_reaches_server_everything_through_unstuck(everything_behind_unstuck: Backbone) -> None:
    backbone = everything_behind_unstuck
    model = MockModel(plan=PLAN).start()
    home = Path(tempfile.mkdtemp(prefix="unstuck-openclaw-upstreams-"))
    entry = {"url": backbone.door_url, "transport": "streamable-http", **_timeout_fields(CLIENT_TIMEOUT_S)}
    try:
        turn = _run_openclaw(_config(model, "unstuck", entry, tool_search=False), model, home)
    finally:
        model.stop()
    offered = [t["function"]["name"] for t in model.requests[0].get("tools", [])] if model.requests else []
    transcript = turn.transcript()
    results = _results(transcript)
    turns = _calling_turns(transcript, tool_search=False)
    ledger = {text for _, reason, text in _ledger_texts(backbone.redis_url) if reason == "ok"}
    # OpenClaw was offered server-everything's tools, through the door
    assert any(name.endswith("everything__echo") for name in offered), offered
    # Each step's one tool_call got exactly one result: the upstream's, as the ledger has it
    assert len(turns) == len(PLAN), transcript
    texts = [results[call_id] for step in turns for call_id in step]
    assert [len(found) for found in texts] == [1] * len(PLAN), texts
    for found, expected in zip(texts, EXPECTED, strict=True):
        assert expected in found[0], texts
        assert found[0] in ledger, (found[0], ledger)
    assert turn.returncode == 0
    assert not turn.leftovers
