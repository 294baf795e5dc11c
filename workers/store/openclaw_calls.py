"""OpenClaw's own tool calls in Redis: started by its plugin, ended once (plugin or watchdog).

Keys in :class:`~workers.store.keys.OpenClawKeys` (one slot), records declared in
:data:`~workers.store.records.OPENCLAW_CALL`. The loop history of these calls lives in the
run's usual sorted set (:mod:`workers.store.loop_history`), so it outlasts OpenClaw restarts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import redis

from workers.core.openclaw_calls import OpenClawCall, OpenClawCallState
from workers.core.openclaw_tombstones import Tombstone
from workers.store.connection import store_errors
from workers.store.keys import OpenClawKeys, quote_part
from workers.store.lua import load_script
from workers.store.records import OPENCLAW_CALL, OpenClawCallField, Row

__all__ = ["OpenClawCalls", "StartedCall", "tombstone_count"]

F = OpenClawCallField


@dataclass(frozen=True)
class StartedCall(OpenClawCall):
    """A call as stored, with what the loop detector needs at its end."""

    params: Any = None
    args_hash: str = ""


class OpenClawCalls:
    """OpenClaw calls on one Redis client (the ledger's)."""

    def __init__(self, client: redis.Redis, *, prefix: str, ttl_s: int) -> None:
        self._client = client
        self._keys = OpenClawKeys(prefix)
        self._ttl_s = ttl_s
        self._end = load_script(client, "openclaw_end.lua")

    def start(self, call: OpenClawCall, params: Any, args_hash: str) -> None:
        """Record a call the plugin reported started (again: the newer report wins)."""
        key = self._keys.call(call.session_key, call.call_id)
        fields: dict[str, str | int] = {
            F.SESSION: call.session_key,
            F.RUN: call.run_id,
            F.AGENT_ID: call.agent_id,
            F.TOOL: call.tool,
            F.CALL_ID: call.call_id,
            F.PARAMS: json.dumps(params, default=str)[:65536],
            F.ARGS_HASH: args_hash,
            F.STARTED_MS: call.started_ms,
            F.DEADLINE_MS: call.deadline_ms,
            F.STATE: call.state.value,
            F.ENDED_MS: call.ended_ms or 0,
        }
        with store_errors():
            pipe = self._client.pipeline(transaction=True)
            pipe.hset(key, mapping=fields)  # type: ignore[arg-type]  # redis-py's mapping type is invariant
            pipe.expire(key, self._ttl_s)
            if call.state is OpenClawCallState.OPEN:
                pipe.zadd(
                    self._keys.open, {OpenClawKeys.member(call.session_key, call.call_id): call.deadline_ms}
                )
            pipe.zadd(self._keys.activity, {quote_part(call.session_key): call.started_ms}, gt=True)
            pipe.expire(self._keys.open, self._ttl_s)
            pipe.expire(self._keys.activity, self._ttl_s)
            pipe.execute()

    def end(self, session_key: str, call_id: str, state: OpenClawCallState, now_ms: int) -> bool:
        """Leave open with ``state``; False when it had ended already (the first end stands)."""
        member = OpenClawKeys.member(session_key, call_id)
        keys = [self._keys.call(session_key, call_id), self._keys.open, self._keys.activity]
        with store_errors():
            won = self._end(keys=keys, args=[state.value, now_ms, member, quote_part(session_key)])
        return bool(won)

    def get(self, session_key: str, call_id: str) -> StartedCall | None:
        """The call's record, or None when unknown (never started, or expired)."""
        with store_errors():
            raw = self._client.hgetall(self._keys.call(session_key, call_id))
        if not raw:
            return None
        return _call(Row(OPENCLAW_CALL, raw, where=f"openclaw call {call_id}"))

    def due(self, now_ms: int, limit: int = 100) -> list[StartedCall]:
        """Open calls whose deadline has passed, oldest first."""
        with store_errors():
            members = self._client.zrangebyscore(self._keys.open, 0, now_ms, start=0, num=limit)
        return self._calls(members)

    def open_calls(self, limit: int = 1000) -> list[StartedCall]:
        """Every open call, soonest deadline first."""
        with store_errors():
            members = self._client.zrange(self._keys.open, 0, limit - 1)
        return self._calls(members)

    def activity(self) -> dict[str, int]:
        """Session key -> its latest reported activity ms."""
        with store_errors():
            rows = self._client.zrange(self._keys.activity, 0, -1, withscores=True)
        pairs: list[Any] = list(rows)
        return {unquote(_text(m)): int(score) for m, score in pairs}

    def model_call(self, session_key: str, run_id: str, *, started: bool, now_ms: int) -> None:
        """A model call of the run started (in flight) or ended; both are the session's activity."""
        member = OpenClawKeys.member(session_key, run_id)
        with store_errors():
            pipe = self._client.pipeline(transaction=True)
            if started:
                pipe.zadd(self._keys.streams, {member: now_ms})
            else:
                pipe.zrem(self._keys.streams, member)
            pipe.zadd(self._keys.activity, {quote_part(session_key): now_ms}, gt=True)
            pipe.expire(self._keys.streams, self._ttl_s)
            pipe.expire(self._keys.activity, self._ttl_s)
            pipe.execute()

    def streams(self) -> list[tuple[str, str, int]]:
        """(session, run, started ms) of every model call in flight."""
        with store_errors():
            rows = self._client.zrange(self._keys.streams, 0, -1, withscores=True)
        pairs: list[Any] = list(rows)
        return [(*OpenClawKeys.parse_member(_text(m)), int(score)) for m, score in pairs]

    def tombstones(self) -> set[Tombstone]:
        """The tombstoned sessions alerted already and still reported."""
        with store_errors():
            members = self._client.smembers(self._keys.tombstones)
        return {Tombstone(*OpenClawKeys.parse_member(_text(m))) for m in members}

    def note_tombstones(self, new: set[Tombstone], gone: set[Tombstone]) -> list[Tombstone]:
        """Record ``new`` and forget ``gone``; the new ones this call added: those to alert (once each)."""
        ordered = sorted(new)
        if not ordered and not gone:
            return []
        with store_errors():
            pipe = self._client.pipeline(transaction=True)
            for tombstone in ordered:
                pipe.sadd(self._keys.tombstones, OpenClawKeys.member(*_pair(tombstone)))
            for tombstone in gone:
                pipe.srem(self._keys.tombstones, OpenClawKeys.member(*_pair(tombstone)))
            pipe.expire(self._keys.tombstones, self._ttl_s)
            added = pipe.execute()[: len(ordered)]
        return [tombstone for tombstone, won in zip(ordered, added, strict=True) if won]

    def _calls(self, members: list[Any]) -> list[StartedCall]:
        calls = []
        for member in members:
            session, call_id = OpenClawKeys.parse_member(_text(member))
            call = self.get(session, call_id)
            if call is None:  # expired under its index entry: drop the hint
                with store_errors():
                    self._client.zrem(self._keys.open, member)
                continue
            calls.append(call)
        return calls


def tombstone_count(client: redis.Redis, prefix: str) -> int:
    """How many sessions OpenClaw's restart recovery holds tombstoned, as last alerted."""
    with store_errors():
        return int(client.scard(OpenClawKeys(prefix).tombstones))


def _pair(tombstone: Tombstone) -> tuple[str, str]:
    return tombstone.session_key, tombstone.session_id


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _call(row: Row[OpenClawCallField]) -> StartedCall:
    ended = row.integer(F.ENDED_MS)
    params_text = row.text(F.PARAMS)
    return StartedCall(
        session_key=row.text(F.SESSION),
        run_id=row.text(F.RUN),
        agent_id=row.text(F.AGENT_ID),
        tool=row.text(F.TOOL),
        call_id=row.text(F.CALL_ID),
        started_ms=row.integer(F.STARTED_MS),
        deadline_ms=row.integer(F.DEADLINE_MS),
        state=row.member(F.STATE, OpenClawCallState),
        ended_ms=ended or None,
        params=json.loads(params_text) if params_text else {},
        args_hash=row.text(F.ARGS_HASH),
    )
