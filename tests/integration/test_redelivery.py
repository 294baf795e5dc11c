"""A call delivered again after its first claim was lost runs nothing a second time.

The pool can hand a job to a new child when the first one died before reporting it accepted;
by then the dead child's claim (and lease) still stand, so the new delivery finds the call
``busy``. It must answer at once rather than leave the call to its lease running out.

A copy of a message (a worker's give-back, a gateway's republish) can reach a worker after
the call's first claim was lost elsewhere and its lease lapsed, before its gateway or the
watchdog noticed. The copy must not run it again: the claim finds it ``lost``, and the call is
requeued (an idempotent tool) or answered ``worker_lost`` by them.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.harness import (
    Proc,
    WorkerOn,
    base_env,
    recorded_runs,
    registration_fields,
    send_by_hand,
    task_outcome,
    wait_until,
)
from workers import ToolGateway
from workers.celery_edge.names import INVOKE_TASK
from workers.core.models import CallJob, CallState
from workers.store.ledger import Ledger


def _registered(ledger: Ledger, session: str, call: dict[str, object]) -> dict[str, object]:
    """Register ``call`` as a gateway would (no message); the job its message carries."""
    now = int(time.time() * 1000)
    registered = CallJob.model_validate({
        "session_key": session, "run_id": "r", "call": call,
        "submitted_ms": now, "deadline_ms": now + 30_000, "soft_s": 2, "hard_s": 3,
    })  # fmt: skip
    fields = {**registration_fields(registered), "dispatched": "1"}
    ledger.register(
        ledger.keys(session, "r"), str(call["id"]), now_ms=now, deadline_ms=now + 30_000, fields=fields
    )
    return registered.model_dump(mode="json")


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
    job = _registered(ledger, "redelivered", {"id": "c1", "name": "echo", "arguments": {"text": "x"}})
    fields = ledger.record(keys, "c1").fields  # type: ignore[union-attr]
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


@pytest.mark.timeout(60)
def test_a_copy_of_a_call_whose_claim_was_lost_runs_nothing(
    redis_url: str, runs_file: Path, worker_on: WorkerOn, gateway: ToolGateway
) -> None:
    # Given a call claimed by a worker of another host, whose lease lapsed (the host was lost)
    worker = worker_on(base_env(redis_url, RECORD_RUN_FILE=str(runs_file)))
    ledger = gateway._rt.ledger
    keys = ledger.keys("lost-claim", "r")
    job = _registered(ledger, "lost-claim", {"id": "c1", "name": "record_run", "arguments": {"tag": "ran"}})
    claim = ledger.claim(
        keys, "c1", worker_id="lost-host:4242", now_ms=int(time.time() * 1000), tool="record_run",
        job_digest=ledger.record(keys, "c1").fields["job_digest"],  # type: ignore[union-attr]
    )  # fmt: skip
    assert (claim.status, claim.attempt) == ("claimed", 1)
    assert ledger.client.delete(keys.lease("c1")) == 1
    # When a copy of its message reaches a worker
    send_by_hand(
        gateway._app, INVOKE_TASK, kwargs={"job": job}, queue=gateway.settings.broker.queue, task_id="copy"
    )
    # Then the worker runs nothing and reports nothing: the call is its gateway's or the watchdog's
    wait_until(lambda: task_outcome(worker.log(), "copy") is not None, timeout_s=15, what="the copy's task")
    assert task_outcome(worker.log(), "copy") == "ignored"
    assert recorded_runs(runs_file) == []
    record = ledger.record(keys, "c1")
    assert record is not None
    assert (record.state, record.fields["attempt"], record.fields["worker"]) == (
        CallState.RUNNING,
        "1",
        "lost-host:4242",
    )
