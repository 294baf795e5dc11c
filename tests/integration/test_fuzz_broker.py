"""Fuzz the broker path of a signed worker: forged, replayed, altered and badly signed messages.

Every message is published by hand (``tests/signing.py``), as someone with write access to
the broker could. The worker's only tool here that matters, ``record_run``, appends one line
per execution to a file: after the run, that file must hold exactly the authorised calls.
The counts tried are printed (``pytest -s``) for the record.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.harness import (
    Proc,
    recorded_runs,
    registration_fields,
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
from workers.store.records import CallField
from workers.store.refusal import refusal_counts

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

EXAMPLES = 300
FINISHED, OPEN = 3, 5
ARGUMENTS = st.dictionaries(
    st.sampled_from(["tag", "text", "command", "url"]) | st.text(max_size=6),
    st.text(max_size=12) | st.integers() | st.none() | st.lists(st.text(max_size=4), max_size=2),
    max_size=3,
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@dataclass(frozen=True)
class Forgery:
    kind: str  # unregistered | mismatch | replay | unreadable | bad_signature
    body: dict[str, Any]  # the job as published (or anything, for unreadable)
    signing: str = "trusted"  # trusted | unsigned | stranger | tampered | garbage


@pytest.fixture
def env(env: dict[str, str], signing: SigningFiles, runs_file: Path) -> dict[str, str]:
    # A shell to reach for: it must stay out of reach.
    return {**env, "RECORD_RUN_FILE": str(runs_file), **signing.env(), "UNSTUCK_TOOLS__BUILTINS": "exec"}


def _open_jobs(gateway: ToolGateway) -> list[CallJob]:
    """Calls registered as the gateway would, whose genuine message is never sent."""
    ledger, now = gateway._rt.ledger, int(time.time() * 1000)
    jobs = []
    for n in range(OPEN):
        call = ToolCall(id=f"open-{n}", name="record_run", arguments={"tag": f"open-{n}"})
        job = CallJob(
            session_key="fuzz", run_id="r", call=call, submitted_ms=now,
            deadline_ms=now + 120_000, soft_s=2, hard_s=3,
        )  # fmt: skip
        fields = {**registration_fields(job), "dispatched": "1"}
        ledger.register(
            ledger.keys("fuzz", "r"), call.id, now_ms=now, deadline_ms=job.deadline_ms, fields=fields
        )
        jobs.append(job)
    return jobs


def _finished_jobs(gateway: ToolGateway) -> list[CallJob]:
    """Calls the gateway ran once (authorised executions), as their registered jobs."""
    calls = [
        ToolCall(id=f"fin-{n}", name="record_run", arguments={"tag": f"fin-{n}"}) for n in range(FINISHED)
    ]
    results = gateway.call_tools(session_key="fuzz-done", run_id="r", calls=calls)
    assert [r.text for r in results] == [f"recorded fin-{n}" for n in range(FINISHED)]
    ledger = gateway._rt.ledger
    records = [ledger.record(ledger.keys("fuzz-done", "r"), call.id) for call in calls]
    return [CallJob.model_validate_json(r.row.text(CallField.JOB)) for r in records if r is not None]


def _altered(job: CallJob, data: st.DataObject) -> dict[str, Any]:
    body = job.model_dump(mode="json")
    change = data.draw(st.sampled_from(["arguments", "tool", "agent_id", "limits"]))
    if change == "arguments":
        body["call"]["arguments"] = data.draw(ARGUMENTS)
    elif change == "tool":
        body["call"]["name"] = data.draw(st.sampled_from(["exec", "echo", "boom", "os.system"]))
        body["call"]["arguments"] = {"command": "touch /tmp/unstuck-fuzz-pwned", "text": "x"}
    elif change == "agent_id":
        body["agent_id"] = data.draw(st.text(min_size=1, max_size=8))
    else:
        body["soft_s"], body["hard_s"] = 600.0, 900.0
    assume(body != job.model_dump(mode="json"))
    return body


def _forgery(data: st.DataObject, open_jobs: list[CallJob], finished: list[CallJob]) -> Forgery:
    kind = data.draw(st.sampled_from(["unregistered", "mismatch", "replay", "unreadable", "bad_signature"]))
    now = int(time.time() * 1000)
    if kind in ("unregistered", "bad_signature"):
        call = {
            "id": data.draw(st.text(min_size=1, max_size=12)),
            "name": data.draw(st.sampled_from(["record_run", "exec", "echo"])),
            "arguments": data.draw(ARGUMENTS) | {"tag": "ghost", "command": "touch /tmp/unstuck-fuzz-pwned"},
        }
        body = {
            "session_key": "fuzz-ghost", "run_id": "r", "call": call, "submitted_ms": now,
            "deadline_ms": now + 60_000, "soft_s": 2, "hard_s": 3,
        }  # fmt: skip
        if kind == "bad_signature":
            # Or a message for a registered call, genuine but for its signature
            body = data.draw(st.sampled_from([body, *(j.model_dump(mode="json") for j in open_jobs)]))
            signing = data.draw(st.sampled_from(["unsigned", "stranger", "tampered", "garbage"]))
            return Forgery(kind, body, signing)
        return Forgery(kind, body)
    if kind == "mismatch":
        return Forgery(kind, _altered(data.draw(st.sampled_from(open_jobs)), data))
    if kind == "replay":
        job = data.draw(st.sampled_from(finished))
        altered = data.draw(st.booleans())
        return Forgery(kind, _altered(job, data) if altered else job.model_dump(mode="json"))
    return Forgery(kind, data.draw(st.dictionaries(st.text(max_size=8), JSON, max_size=5)))


def _payload(
    forgery: Forgery, body: bytes, signing: SigningFiles, stranger: SigningFiles, junk: bytes
) -> bytes:
    if forgery.signing == "trusted":
        return sign(signing, body)
    if forgery.signing == "stranger":
        return sign(stranger, body)
    if forgery.signing == "tampered":
        return tamper(sign(signing, body.replace(b'"tag"', b'"tga"')), body)
    return junk if forgery.signing == "garbage" else body


EXPECTED = {
    "unregistered": {"unregistered"},
    "mismatch": {"mismatch", "reported"},  # reported: an earlier forgery already answered the call
    "replay": {"reported"},  # the finished call's stored answer, not a second run
    "unreadable": {"unreadable", "unregistered"},
}


def test_no_forged_message_runs_anything(
    worker: Proc, gateway: ToolGateway, runs_file: Path, signing: SigningFiles, tmp_path: Path
) -> None:
    app, queue = gateway._app, gateway.settings.broker.queue
    stranger = make_signing_files(tmp_path / "stranger", name="stranger")
    finished, open_jobs = _finished_jobs(gateway), _open_jobs(gateway)
    authorised = sorted(f"fin-{n}" for n in range(FINISHED))
    assert sorted(recorded_runs(runs_file)) == authorised
    sent: dict[str, Forgery] = {}

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data(), junk=st.binary(max_size=64))
    def publish_one(data: st.DataObject, junk: bytes) -> None:
        forgery = _forgery(data, open_jobs, finished)
        task_id = f"fz-{len(sent)}"
        headers, properties, body = invoke_body(app, forgery.body, task_id)
        payload = _payload(forgery, body, signing, stranger, junk)
        publish_raw(app, queue, headers, properties, payload, signed=forgery.signing != "unsigned")
        sent[task_id] = forgery

    publish_one()
    # When a genuine call follows every forgery through the queue
    (last,) = gateway.call_tools(
        session_key="fuzz-ok",
        run_id="r",
        calls=[ToolCall(id="ok", name="record_run", arguments={"tag": "ok"})],
    )
    assert last.text == "recorded ok"
    signed = [task_id for task_id, f in sent.items() if f.signing == "trusted"]
    wait_until(
        lambda: all(task_outcome(worker.log(), task_id) for task_id in signed),
        timeout_s=120,
        what="every validly signed forgery handled",
    )
    # Then the runs file holds the authorised calls only: no forgery executed anything
    runs = recorded_runs(runs_file)
    assert sorted(runs) == sorted([*authorised, "ok"]), runs
    # And each forgery met the refusal its kind calls for
    log = worker.log()
    outcomes = {task_id: str(task_outcome(log, task_id)) for task_id in signed}
    wrong = {t: (sent[t].kind, o) for t, o in outcomes.items() if o not in EXPECTED[sent[t].kind]}
    assert wrong == {}
    rejected = log.count("] Can't decode message body")
    rejected += log.count("invalid task message: Refusing to deserialize")
    assert rejected == len(sent) - len(signed)
    ledger = gateway._rt.ledger
    answered = ledger.results(ledger.keys("fuzz", "r"), [job.call.id for job in open_jobs])
    mismatched = {sent[t].body["call"]["id"] for t in signed if sent[t].kind == "mismatch"}
    assert {call_id for call_id, r in answered.items() if r.reason == "call_mismatch"} == mismatched
    refused = refusal_counts(ledger.client, ledger.prefix)
    kinds = Counter(f.kind if f.signing == "trusted" else f"bad_signature/{f.signing}" for f in sent.values())
    print(
        f"\nbroker fuzz: {len(sent)} forged messages {dict(sorted(kinds.items()))}; "
        f"worker outcomes {dict(Counter(outcomes.values()))}; refused before task code: {rejected}; "
        f"refusal counters {{{', '.join(f'{r.value}: {n}' for r, n in refused.items())}}}; "
        f"executions: {len(runs)} ({len(runs)} authorised, 0 unauthorised)"
    )
    assert refused[RefusalReason.UNREGISTERED] == list(outcomes.values()).count("unregistered")
    assert refused[RefusalReason.UNDECODABLE] + refused[RefusalReason.UNTRUSTED_CONTENT] == rejected
