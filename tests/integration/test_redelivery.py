"""A call redelivered after its first pool child died holding the claim is answered ``crashed``.

The pool can hand a job to a new child when the first one died before reporting it accepted;
by then the dead child's claim (and lease) still stand, so the new delivery finds the call
``busy``. It must answer at once rather than leave the call to its lease running out.
"""

from __future__ import annotations

import socket
import subprocess
import time

import pytest

from tests.harness import Proc, registration_fields, send_by_hand, wait_until
from workers import ToolGateway
from workers.celery_edge.names import INVOKE_TASK
from workers.core.models import CallJob


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.timeout(60)
def test_redelivery_of_a_call_held_by_a_dead_child_is_answered_crashed(
    worker: Proc, gateway: ToolGateway
) -> None:
    # Given a call claimed by a child of this host that has died, its lease still standing for a minute
    ledger = gateway._rt.ledger
    keys = ledger.keys("redelivered", "r")
    now = int(time.time() * 1000)
    call = {"id": "c1", "name": "echo", "arguments": {"text": "x"}}
    registered = CallJob.model_validate({
        "session_key": "redelivered", "run_id": "r", "call": call,
        "submitted_ms": now, "deadline_ms": now + 30_000, "soft_s": 2, "hard_s": 3,
    })  # fmt: skip
    job = registered.model_dump(mode="json")  # the message carries the registered form
    fields = {**registration_fields(registered), "dispatched": "1"}
    ledger.register(keys, "c1", now_ms=now, deadline_ms=now + 30_000, fields=fields)
    holder = f"{socket.gethostname()}:{_dead_pid()}"
    claim = ledger.claim(
        keys, "c1", worker_id=holder, now_ms=now, tool="echo", job_digest=fields["job_digest"]
    )
    assert claim.status == "claimed"
    ledger.client.set(keys.lease("c1"), holder, px=60_000)
    # When the pool delivers the call again
    send_by_hand(gateway._app, INVOKE_TASK, kwargs={"job": job}, queue=gateway.settings.broker.queue)
    # Then it is answered crashed, long before the lease would run out
    wait_until(
        lambda: bool(ledger.results(keys, ["c1"])), timeout_s=10, what="answer to the redelivered call"
    )
    result = ledger.results(keys, ["c1"])["c1"]
    assert result.reason == "crashed"
    assert holder in str(result.details.get("detail", ""))
