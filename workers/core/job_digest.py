"""The job digest: what binds an invoke task message to the call the gateway registered."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["canonical_json", "digest_of", "job_digest"]


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


def job_digest(json_form: Mapping[str, Any]) -> str:
    """The hex SHA-256 of a job's JSON form, serialised canonically.

    The gateway gives ``CallJob.model_dump(mode="json")``, the form its message carries; the
    worker gives the message's ``job`` as it received it, before validation: the same value
    after the broker's JSON round trip, with no second serialisation in the pool child. A
    message that validates to the same job but differs from the registered form (a field
    added, one left to its default) is refused: only the registered bytes run.
    """
    return digest_of(canonical_json(json_form).encode())


def digest_of(canonical: bytes) -> str:
    """The hex SHA-256 of a job already serialised by :func:`canonical_json` (and encoded)."""
    return hashlib.sha256(canonical).hexdigest()
