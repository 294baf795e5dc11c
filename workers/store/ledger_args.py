"""The keys and arguments of the ledger scripts that change a call: one builder per script.

The sync :class:`~workers.store.ledger.Ledger` and the async ledgers run the same scripts; they
build their ``KEYS`` and ``ARGV`` here, so a script's argument list changes in one place.

TTLs: ``ttl_s`` is ``ledger.ttl_s``; ``refresh_s`` (:data:`KEYS_REFRESH_S`) is how often the
run's ``calls`` and ``done`` keys get their TTL again (see ``ledger_register.lua``
and the table in :mod:`workers.store.keys`).
"""

from __future__ import annotations

import secrets
from typing import Any

from workers.core.models import ToolResult
from workers.store.index_ttl import REFRESH_INTERVAL_S
from workers.store.keys import RunKeys
from workers.store.records import CallField

__all__ = [
    "KEYS_REFRESH_S",
    "ScriptCall",
    "claim_call",
    "done_expire_s",
    "finish_call",
    "register_call",
]

#: Seconds between two refreshes of a run's calls/done TTLs (as the index keys' interval).
KEYS_REFRESH_S = REFRESH_INTERVAL_S

ScriptCall = tuple[list[str], list[Any]]  # (KEYS, ARGV)


def done_expire_s(ttl_s: int) -> int:
    """The TTL a run's ``done`` list (and ``calls``) gets when it is set."""
    return ttl_s + 2 * KEYS_REFRESH_S


def register_call(
    keys: RunKeys,
    call_id: str,
    *,
    now_ms: int,
    deadline_ms: int,
    ttl_s: int,
    fields: list[str],
    push: tuple[str, str] | None = None,
) -> ScriptCall:
    """``ledger_register.lua``: ``fields`` flattened field/value pairs of the new record.

    ``push`` (a list key, a message) is pushed by the script when the call is new. A nonce of
    its own goes last (field ``reg``): the same arguments sent again are the same registration.
    """
    script_keys = [keys.call(call_id), keys.calls, keys.run]
    message = ""
    if push is not None:
        script_keys.append(push[0])
        message = push[1]
    nonce = [CallField.REG.value, secrets.token_hex(8)]
    return script_keys, [call_id, now_ms, deadline_ms, ttl_s, KEYS_REFRESH_S, message, *fields, *nonce]


def claim_call(
    keys: RunKeys, call_id: str, *, now_ms: int, worker_id: str, lease_ttl_ms: int, tool: str, job_digest: str
) -> ScriptCall:
    """``ledger_claim.lua``, with a nonce of its own: the same arguments sent again are the same claim."""
    script_keys = [keys.call(call_id), keys.lease(call_id), keys.run]
    return script_keys, [now_ms, worker_id, lease_ttl_ms, tool, job_digest, secrets.token_hex(8)]


def finish_call(keys: RunKeys, result: ToolResult, *, now_ms: int, ttl_s: int, writer: str) -> ScriptCall:
    """``ledger_finish.lua`` for ``result`` (after any fallback was applied)."""
    call_id = result.tool_call_id
    script_keys = [keys.call(call_id), keys.late(call_id), keys.done, keys.run, keys.calls]
    args = [call_id, result.to_json(), result.reason or "", now_ms, ttl_s, writer, KEYS_REFRESH_S]
    return script_keys, args
