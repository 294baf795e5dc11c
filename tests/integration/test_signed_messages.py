"""broker.signing on: a worker runs signed messages only; unsigned and tampered ones run nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.harness import (
    Proc,
    recorded_runs,
    registration_fields,
    start_beat,
    start_watchdog,
    task_outcome,
    wait_until,
)
from tests.signing import (
    SigningFiles,
    invoke_body,
    make_signing_files,
    publish_raw,
    sign,
    tamper,
)
from workers import ToolCall, ToolGateway
from workers.core.models import CallJob
from workers.core.refusal import RefusalReason
from workers.store.refusal import refusal_counts

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def env(env: dict[str, str], signing: SigningFiles, runs_file: Path) -> dict[str, str]:
    return {**env, "RECORD_RUN_FILE": str(runs_file), **signing.env()}


def _registered_job(gateway: ToolGateway, call_id: str, tag: str) -> CallJob:
    """A call registered exactly as the gateway would, so only the signature can stop it."""
    now = int(time.time() * 1000)
    job = CallJob(
        session_key="signed",
        run_id="r",
        call=ToolCall(id=call_id, name="record_run", arguments={"tag": tag}),
        submitted_ms=now,
        deadline_ms=now + 20_000,
        soft_s=2,
        hard_s=3,
    )
    ledger = gateway._rt.ledger
    fields = {**registration_fields(job), "dispatched": "1"}
    ledger.register(
        ledger.keys("signed", "r"), call_id, now_ms=now, deadline_ms=job.deadline_ms, fields=fields
    )
    return job


def _outcome_logged(worker: Proc, task_id: str) -> bool:
    return task_outcome(worker.log(), task_id) is not None


def test_signed_calls_run_and_unsigned_or_tampered_messages_run_nothing(
    worker: Proc, gateway: ToolGateway, runs_file: Path, tmp_path: Path, signing: SigningFiles
) -> None:
    app, queue = gateway._app, gateway.settings.broker.queue
    assert app.conf.task_serializer == "auth"
    stranger = make_signing_files(tmp_path / "stranger", name="stranger")  # a key the worker does not trust
    # Given registered calls whose messages reach the queue by hand: unsigned, signed by an untrusted
    # key, signed and then changed, and (the control) signed with the trusted key
    sent = {}
    for call_id in ("unsigned", "stranger", "tampered", "trusted"):
        job = _registered_job(gateway, call_id, call_id).model_dump(mode="json")
        sent[call_id] = invoke_body(app, job, f"{call_id}-1")
    headers, properties, body = sent["unsigned"]
    publish_raw(app, queue, headers, properties, body, signed=False)
    headers, properties, body = sent["stranger"]
    publish_raw(app, queue, headers, properties, sign(stranger, body), signed=True)
    headers, properties, body = sent["tampered"]
    original = body.replace(b'"tag": "tampered"', b'"tag": "harmless"')
    publish_raw(app, queue, headers, properties, tamper(sign(signing, original), body), signed=True)
    # An empty signed body made Celery's own handler raise out of the event loop and stop the worker
    headers, properties, _ = invoke_body(app, {}, "empty-1")
    publish_raw(app, queue, headers, properties, b"", signed=True)
    headers, properties, body = sent["trusted"]
    publish_raw(app, queue, headers, properties, sign(signing, body), signed=True)
    # When a correctly signed call follows through the gateway
    (result,) = gateway.call_tools(
        session_key="signed-ok",
        run_id="r",
        calls=[ToolCall(id="ok", name="record_run", arguments={"tag": "ok"})],
    )
    # Then the signed ones run, and the worker refused the others before any task code ran
    assert result.text == "recorded ok"
    wait_until(lambda: _outcome_logged(worker, "trusted-1"), timeout_s=10, what="trusted message run")
    log = worker.log()
    assert "Refusing to deserialize untrusted content of type json" in log
    assert "'id': 'stranger-1'" in log
    assert "Unknown certificate" in log
    assert "'id': 'tampered-1'" in log
    assert "'id': 'empty-1'" in log
    assert log.count("] Can't decode message body") == 3
    assert "Unrecoverable error" not in log
    assert sorted(recorded_runs(runs_file)) == ["ok", "trusted"]
    for task_id in ("unsigned-1", "stranger-1", "tampered-1", "empty-1"):
        assert not _outcome_logged(worker, task_id)
    # And each refusal is counted for the metrics
    ledger = gateway._rt.ledger
    refused = refusal_counts(ledger.client, ledger.prefix)
    assert refused[RefusalReason.UNTRUSTED_CONTENT] == 1
    assert refused[RefusalReason.UNDECODABLE] == 3


def test_beat_and_watchdog_exchange_signed_sweeps(env: dict[str, str]) -> None:
    # Given beat and the watchdog, both signing (the control role and its sender)
    env = env | {"UNSTUCK_WATCHDOG__INTERVAL_S": "1"}
    watchdog = start_watchdog(env, name="signed")
    beat = start_beat(env)
    try:
        # Then the sweeps beat sends are accepted and run
        watchdog.wait_for_log("unstuck.watchdog.sweep[", timeout_s=30)
        wait_until(lambda: "] succeeded" in watchdog.log(), timeout_s=30, what="a signed sweep run")
        assert "Refusing to deserialize" not in watchdog.log()
        assert "Can't decode message body" not in watchdog.log()
    finally:
        beat.kill()
        watchdog.kill()
