"""The job digest: what binds an invoke task message to the call the gateway registered."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from workers.core.models import CallJob

__all__ = ["canonical_json", "job_digest"]


# What binds a task message to its registration: a digest of the whole job, computed alike on
# both ends. The gateway stores job_digest of the job it validated when it registers the call;
# the worker computes it again from the message it received and the claim compares the two, so
# a message that is not the one the gateway registered (tool, arguments, agent, limits,
# deadline) runs nothing. It is taken over the JSON form the message carries, serialised
# canonically (sorted keys, no spaces, ASCII only): the gateway's job and the worker's parse of
# the same message give the same bytes, whatever order the broker's JSON round trip left.


def canonical_json(value: Any) -> str:
    """``value`` as JSON with sorted keys, no whitespace and only ASCII (one spelling per value)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)


def job_digest(job: CallJob) -> str:
    """The hex SHA-256 of the job's canonical JSON form."""
    return hashlib.sha256(canonical_json(job.model_dump(mode="json")).encode()).hexdigest()
