"""What binds a task message to its registration: a digest of the whole job, computed alike on both ends.

The gateway stores :func:`job_digest` of the job it validated when it registers the call; the
worker computes it again from the message it received and the claim compares the two. Any
change to the message (tool, arguments, agent, limits, deadline) changes the digest, so a
message that is not the one the gateway registered runs nothing.

The digest is taken over the JSON form of the job (``model_dump(mode="json")``), the form
the message carries, serialised canonically (sorted keys, no spaces, ASCII only): the
gateway's job and the worker's parse of the same message give the same bytes, whatever
order the broker's JSON round trip left the keys in.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from workers.core.models import CallJob

__all__ = ["canonical_json", "job_digest"]


def canonical_json(value: Any) -> str:
    """``value`` as JSON with sorted keys, no whitespace and only ASCII (one spelling per value)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)


def job_digest(job: CallJob) -> str:
    """The hex SHA-256 of the job's canonical JSON form."""
    return hashlib.sha256(canonical_json(job.model_dump(mode="json")).encode()).hexdigest()
