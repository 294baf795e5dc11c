"""No Redis failure escapes ``call_tools``: every call is answered, whichever round trip fails.

A failover looks, to a gateway, like its Redis replies stopping for a few seconds at some
point of a call's path (``Timeout reading from socket`` from a stopped primary, refused
connections from a dead one). This fails every Redis reply of the test process (the
gateway's store and its broker connections alike; the worker is another process) from
the k-th reply of a call on, for longer than redis-py's own retries last, for each k along
the path of one call, and checks that the call is still answered (one result, nothing
raised) with what the ledger holds. A failed reply is one whose command Redis ran (as a
stopped primary runs what it finds on its socket when it resumes): a registration can be
written, and its call run, though the gateway never heard back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.connection import AbstractConnection

from tests.harness import Proc, wait_until
from workers import ToolCall, ToolGateway, ToolResult

pytestmark = [pytest.mark.slow]

#: Longer than redis-py's retries of one command (10, backoff capped at 1 s) on a refused reply.
OUTAGE_S = 4.0


class Outage:
    """Fails this process's Redis replies from the ``fail_from``-th on, for ``OUTAGE_S``."""

    def __init__(self) -> None:
        self.replies = 0
        self.fail_from: int | None = None
        self.failing_until = 0.0
        self.caller = threading.get_ident()  # the thread calling call_tools: its path only
        self._lock = threading.Lock()

    def wrap(self, read: Callable[..., Any]) -> Callable[..., Any]:
        def read_response(conn: AbstractConnection, *args: Any, **kwargs: Any) -> Any:
            if self._fails_now():
                conn.disconnect()  # type: ignore[no-untyped-call]
                raise redis.TimeoutError("Timeout reading from socket")
            return read(conn, *args, **kwargs)

        return read_response

    def _fails_now(self) -> bool:
        if threading.get_ident() != self.caller:
            return False
        with self._lock:
            self.replies += 1
            if self.fail_from is None or self.replies < self.fail_from:
                return False
            if self.replies == self.fail_from:
                self.failing_until = time.monotonic() + OUTAGE_S
            return time.monotonic() < self.failing_until

    def arm(self, nth: int | None) -> None:
        with self._lock:
            self.replies, self.fail_from, self.failing_until = 0, nth, 0.0


@pytest.fixture
def outage(monkeypatch: pytest.MonkeyPatch) -> Iterator[Outage]:
    made = Outage()
    monkeypatch.setattr(AbstractConnection, "read_response", made.wrap(AbstractConnection.read_response))
    yield made
    made.arm(None)


@pytest.mark.timeout(600)
def test_no_redis_outage_along_a_calls_path_escapes_call_tools(
    worker: Proc, gateway: ToolGateway, outage: Outage
) -> None:
    # Given a gateway and a worker, and the number of Redis replies one call's path reads
    outage.arm(None)
    assert gateway.call_tools(session_key="s", run_id="r", calls=[ToolCall(id="warm", name="echo")])
    outage.arm(None)
    gateway.call_tools(session_key="s", run_id="r", calls=[ToolCall(id="count", name="echo")])
    path = outage.replies
    assert path >= 2
    escaped: dict[int, str] = {}
    answered: dict[int, list[ToolResult]] = {}
    for nth in range(1, path + 1):
        # When the gateway's Redis replies fail from the nth on, for longer than redis-py retries
        outage.arm(nth)
        call = ToolCall(id=f"c{nth}", name="echo", arguments={"text": str(nth)})
        try:
            results = gateway.call_tools(session_key="s", run_id="r", calls=[call])
        except Exception as exc:  # noqa: BLE001 - what escapes is what this test reports
            escaped[nth] = f"{type(exc).__name__}: {exc}"
            continue
        answered[nth] = results
    # Then every call got its one answer, and nothing was raised out of call_tools
    assert escaped == {}
    assert {nth: [r.tool_call_id for r in got] for nth, got in answered.items()} == {
        nth: [f"c{nth}"] for nth in range(1, path + 1)
    }
    # and what each agent was handed is what the ledger holds once Redis answers again (a
    # registration whose reply was lost was written: a worker answered it)
    delivered = {got[0].tool_call_id: got[0] for got in answered.values()}
    outage.arm(None)  # the last call can be answered (at its margin) before its outage ends
    ledger = gateway._rt.ledger
    keys = ledger.keys("s", "r")
    wait_until(
        lambda: ledger.results(keys, list(delivered)) == delivered,
        timeout_s=30,
        what=f"the ledger holding what was delivered: {delivered}",
    )
