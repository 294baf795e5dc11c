"""How many of the project's modules one healthy call runs through in the agent's process.

A reader follows a call through the modules it touches; the fewer, the easier the path is to
read and change. Measured with ``sys.setprofile`` around one sync ``call_tools`` (after a
warm-up call, so first-use imports and connection setup are not counted) against a real
worker and a private redis-server: every Python function entered on the agent's thread whose
file lies under ``workers/`` or ``tasks/`` counts its module once.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from tests.harness import Proc
from workers import ToolCall, ToolGateway

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (ROOT / "workers", ROOT / "tasks")

# The most modules one healthy call may touch on the agent's side. The 28 it touches: the
# gateway's six (client, call_path, dispatching, batch, and the generated _sync.registering
# and _sync.waiter: issue 43 wrote registration and the wait once, for both drivers); the
# core's models, waiting, reaping (the next look's time), call_limits and job_digest (three
# concepts models.py and waiting.py held together until issue 43 split them: the same code,
# more named rooms); the tool registry; the store's ledger, keys, records and sessions, with
# connection and replica_acks (entered even on a lone Redis), and what issue 43 split out of
# the ledger so each operation is written once: ledger_ops (the script table), done_signals,
# and the generated _sync.ledger_client and _sync.replica_sends; the Celery edge's messages
# and task_events; and tracing.spans (a look-up when tracing is off); and the answering
# service, because the traced call's run supersedes the warm-up's, whose open calls (none) it
# answers: the same two reads the store made itself before issue 43 moved every writer of
# answers there. And the store's run_indexes (issue 46): when a run's calls key expires,
# which each registration passes; and the store's lua, whose run_scripts sends the traced
# run's record and its indexes in one round trip when the run begins (issue 46). And the
# store's pipelines, the lean pipeline every round trip of the sync ledger is sent on: it took
# about 40 % of a round trip's CPU off redis-py's pipeline (issue 46); folded into another
# module it would be a second concept there.
MAX_MODULES = 29


def _project_module(filename: str) -> str | None:
    path = Path(filename)
    for package in PACKAGES:
        if path.is_relative_to(package):
            return path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
    return None


def _modules_touched(gateway: ToolGateway, call: ToolCall, run_id: str) -> set[str]:
    touched: set[str] = set()

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call":
            module = _project_module(frame.f_code.co_filename)
            if module is not None:
                touched.add(module)

    sys.setprofile(profile)
    try:
        results = gateway.call_tools(session_key="modules", run_id=run_id, calls=[call])
    finally:
        sys.setprofile(None)
    assert [(r.tool_call_id, r.is_error, r.text) for r in results] == [(call.id, False, "abab")]
    return touched


@pytest.mark.timeout(60)
def test_one_healthy_call_touches_few_project_modules(worker: Proc, gateway: ToolGateway) -> None:
    # Given a gateway that has made one call already (imports and connections are warm)
    _modules_touched(gateway, ToolCall(id="warm", name="echo", arguments={"text": "ab", "times": 2}), "r0")
    # When one more healthy call is traced
    touched = _modules_touched(
        gateway, ToolCall(id="c1", name="echo", arguments={"text": "ab", "times": 2}), "r1"
    )
    # Then it stays within the budget (the list is in the failure message, to see what grew)
    assert len(touched) <= MAX_MODULES, f"{len(touched)} modules: {sorted(touched)}"
