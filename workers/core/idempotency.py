"""The idempotency key of a tool call: the same for every execution of the call.

Execution is at least once: a call whose worker was lost may run again (an idempotent tool
re-run elsewhere, a claim a Redis failover discarded). A tool with side effects outside
unstuck hands this key to whatever it changes (an ``Idempotency-Key`` header, a unique
column), so a second execution is recognised there as the same call.
"""

from __future__ import annotations

import hashlib
import json

__all__ = ["idempotency_key"]


def idempotency_key(session_key: str, run_id: str, call_id: str) -> str:
    """``uk-`` and 32 hex digits: a digest of the call's identity, never of the attempt.

    JSON-encoded before hashing, so no choice of ids can make two calls share a key.
    """
    identity = json.dumps([session_key, run_id, call_id], ensure_ascii=False)
    return "uk-" + hashlib.sha256(identity.encode()).hexdigest()[:32]
