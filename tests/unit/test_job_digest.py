"""The job digest: the same for a message and its registration, different for any change."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kombu.utils.json import dumps, loads

from workers.core.job_digest import canonical_json, digest_of, job_digest
from workers.core.models import CallJob, ToolCall

ARGUMENTS = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)


def _job(arguments: dict[str, Any], **changes: Any) -> CallJob:
    fields = {
        "session_key": "s",
        "run_id": "r",
        "agent_id": "main",
        "call": ToolCall(id="c1", name="record_run", arguments=arguments),
        "submitted_ms": 1_000,
        "deadline_ms": 61_000,
        "soft_s": 30.0,
        "hard_s": 35.0,
    }
    return CallJob(**(fields | changes))


@settings(max_examples=300, deadline=None)
@given(arguments=st.dictionaries(st.text(max_size=8), ARGUMENTS, max_size=5))
def test_a_message_through_the_broker_keeps_its_registered_digest(arguments: dict[str, Any]) -> None:
    # Given a job as the gateway registers it and the body the broker carries (kombu's JSON)
    job = _job(arguments)
    received = loads(dumps({"job": job.model_dump(mode="json")}))["job"]
    # Then the worker's digest of the message it received is the registered one: a genuine call
    # is never refused
    assert job_digest(received) == job_digest(job.model_dump(mode="json"))


@settings(max_examples=200, deadline=None)
@given(
    arguments=st.dictionaries(st.text(max_size=8), ARGUMENTS, max_size=4),
    change=st.sampled_from(["arguments", "tool", "agent_id", "soft_s", "deadline_ms", "run_id"]),
)
def test_any_change_to_the_job_changes_its_digest(arguments: dict[str, Any], change: str) -> None:
    job = _job(arguments)
    changes: dict[str, dict[str, Any]] = {
        "arguments": {"call": ToolCall(id="c1", name="record_run", arguments={**arguments, "\x00": 1})},
        "tool": {"call": ToolCall(id="c1", name="exec", arguments=arguments)},
        "agent_id": {"agent_id": "admin"},
        "soft_s": {"soft_s": 31.0},
        "deadline_ms": {"deadline_ms": 61_001},
        "run_id": {"run_id": "r2"},
    }
    changed = _job(arguments, **changes[change])
    assert job_digest(changed.model_dump(mode="json")) != job_digest(job.model_dump(mode="json"))


def test_canonical_json_ignores_key_order() -> None:
    assert canonical_json({"b": 1, "a": [1, {"y": 2, "x": "é"}]}) == canonical_json(
        json.loads('{"a": [1, {"x": "\\u00e9", "y": 2}], "b": 1}')
    )


def test_a_form_that_validates_to_the_same_job_but_is_not_the_registered_one_differs() -> None:
    # Given the registered form and a message that leaves a field to its default
    job = _job({"x": 1})
    registered = job.model_dump(mode="json")
    shorter = {k: v for k, v in registered.items() if k != "agent_id"}
    assert CallJob.model_validate(shorter) == job
    # Then only the registered form carries the registered digest
    assert job_digest(shorter) != job_digest(registered)


@settings(max_examples=100, deadline=None)
@given(arguments=st.dictionaries(st.text(max_size=8), ARGUMENTS, max_size=5))
def test_the_digest_of_a_canonical_serialisation_is_the_jobs_digest(arguments: dict[str, Any]) -> None:
    # The pool child serialises a job once, for its slot and its claim: the digest must not move
    form = _job(arguments).model_dump(mode="json")
    assert digest_of(canonical_json(form).encode()) == job_digest(form)
