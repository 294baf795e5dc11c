"""The loop check with the decision in Python only: the prototype the loop scripts are measured against.

Redis only moves data: one script appends the pending record (its seq is the newest score + 1,
so the append must be atomic) and returns the window before it; no state is kept beside the
history. The window is parsed and :func:`workers.core.loops.signals.signals_of` computes the
signals in Python, as the in-memory store does. ``python -m bench.loops`` prints its cost
beside the check it would replace.
"""

from __future__ import annotations

import json

import redis

from workers.core.loops import HistoryEntry, RunScope
from workers.core.loops.signals import WindowSignals, signals_of
from workers.store.keys import RunKeys
from workers.store.lua import run_script

__all__ = ["WindowOnlyHistory"]

APPEND_AND_READ = """
local hist, n = KEYS[1], tonumber(ARGV[1])
local last = redis.call('ZRANGE', hist, -1, -1, 'WITHSCORES')
local seq = last[2] and tonumber(last[2]) + 1 or 1
local window = redis.call('ZRANGE', hist, -n, -1)
redis.call('ZADD', hist, seq, seq .. '|' .. ARGV[2])
redis.call('ZREMRANGEBYRANK', hist, 0, -(n + 2))
redis.call('EXPIRE', hist, ARGV[3])
return {seq, window}
"""


def _entry(member: bytes | str) -> HistoryEntry:
    text = member.decode() if isinstance(member, bytes) else member
    seq, _, body = text.partition("|")
    data = json.loads(body)
    data["s"] = int(seq)
    return HistoryEntry.from_dict(data)


class WindowOnlyHistory:
    """``check_call`` over a history ZSET with no state kept beside it (the same member layout)."""

    def __init__(self, client: redis.Redis, *, prefix: str, ttl_s: int) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl_s = ttl_s
        self._script = client.register_script(APPEND_AND_READ)

    def check_call(
        self, scope: RunScope, entry: HistoryEntry, history_size: int, evidence_at: int, now_ms: int
    ) -> tuple[WindowSignals, int]:
        """Append ``entry``; the signals of the window before it, computed here."""
        keys = RunKeys(self._prefix, scope.session_key, scope.run_id)
        body = json.dumps(
            {"t": entry.tool_name, "a": entry.args_hash, "c": entry.tool_call_id, "ts": now_ms},
            separators=(",", ":"),
        )
        seq, members = run_script(
            self._client, self._script, [keys.history], [history_size, body, self._ttl_s]
        )
        window = [_entry(member) for member in members]
        signals = signals_of(
            window,
            tool=entry.tool_name,
            args_hash=entry.args_hash,
            run_id=entry.run_id,
            evidence_at=evidence_at,
        )
        return signals, int(seq)

    def discard_call(self, scope: RunScope, seq: int) -> None:
        """Remove the record a check appended."""
        keys = RunKeys(self._prefix, scope.session_key, scope.run_id)
        self._client.zremrangebyscore(keys.history, seq, seq)
