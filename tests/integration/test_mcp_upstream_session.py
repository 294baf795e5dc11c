"""One session to a real MCP server process (the misbehaving fixture), outside any worker."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest

from tests.harness import REPO
from workers.core.mcp_upstreams import StdioUpstream
from workers.tools.upstream_session import (
    CallCancelled,
    UpstreamCrashed,
    UpstreamSession,
    UpstreamUnavailable,
)

FIXTURE = str(REPO / "tests" / "fixtures" / "mcp_misbehaving.py")


@pytest.fixture
def session() -> Iterator[UpstreamSession]:
    started = UpstreamSession(StdioUpstream(name="mis", command=sys.executable, args=(FIXTURE,)))
    started.ensure_started()
    yield started
    started.close()


def _text(session: UpstreamSession, tool: str) -> str:
    block = session.call(tool, {}).content[0]
    return str(getattr(block, "text", ""))


def test_a_cancel_reaches_the_upstream_and_the_session_keeps_its_state(session: UpstreamSession) -> None:
    first = _text(session, "count")
    started = time.monotonic()
    with pytest.raises(CallCancelled):
        session.call("hang", {}, cancelled=lambda: time.monotonic() - started > 0.3)
    waited = time.monotonic() - started
    # The same process answers next, its counter kept: nothing was killed or restarted
    assert waited < 1.5
    assert first.startswith("1 pid=")
    assert _text(session, "count") == first.replace("1 pid=", "2 pid=")


def test_a_crash_is_reported_and_the_next_start_is_a_new_process(session: UpstreamSession) -> None:
    before = _text(session, "count")
    with pytest.raises(UpstreamCrashed, match="exited during the call"):
        session.call("crash", {})
    session.ensure_started()
    after = _text(session, "count")
    assert after.startswith("1 pid=")
    assert after != before


def test_a_server_that_cannot_start_is_named_with_its_stderr() -> None:
    broken = UpstreamSession(
        StdioUpstream(name="broken", command=sys.executable, args=(FIXTURE,), env={"MISBEHAVING_BROKEN": "1"})
    )
    with pytest.raises(UpstreamUnavailable, match=r"broken .* did not start.*missing API key"):
        broken.ensure_started(timeout_s=20)
