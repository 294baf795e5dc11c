"""The Redis :class:`~workers.core.loops.LoopHistory`: one sorted set per run, one Lua call per step.

Layout (keys from :mod:`workers.store.keys`, every key written here gets a TTL of ``ttl_s``):

* ``RunKeys.history`` (ZSET): member ``"<seq>|<entry json>"`` scored by ``seq``, a per-run
  counter (the highest score + 1). Holds at most ``historySize + 1`` records; every read looks
  at the newest ``historySize`` only (see :mod:`workers.core.loops.history`). Written and read
  only by the ``loop_*.lua`` scripts.
* ``RunKeys.loop_state`` (HASH, ``records.LOOPS``): the detector's counts and streaks over
  that window, kept by the same scripts (``lib_loop_state.lua``), so that a check
  (:meth:`RedisLoopHistory.check_call`) reads a few fields instead of the window.
* ``RunKeys.run`` (HASH, shared with the gateway; its TTL is only ever extended here):
  ``guard_remaining`` (outcomes the armed post-compaction guard still watches),
  ``guard_window`` (observed ``[tool, argsHash, resultHash]`` triples, one JSON array a line),
  ``guard_armed_ms``; and for warning de-duplication ``loop_warn:<key>`` =
  ``"<insertion seq>:<last bucket>"``, ``loop_warn_seq``, ``loop_warn_count``.

Timestamps come in as script arguments; no script reads the server clock.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from workers.core.loops.guard import GuardTriple
from workers.core.loops.history import WARNING_KEY_LIMIT, HistoryEntry, RunScope
from workers.core.loops.signals import WindowSignals
from workers.errors import StoreError
from workers.store.connection import store_errors
from workers.store.keys import RunKeys
from workers.store.ledger import Ledger
from workers.store.lua import LOOP_STATE_LIBRARY, load_script, run_script
from workers.store.records import RunField

__all__ = ["RedisLoopHistory"]

_GUARD_FIELDS = (RunField.GUARD_REMAINING, RunField.GUARD_WINDOW, RunField.GUARD_ARMED_MS)


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _entry_body(entry: HistoryEntry, now_ms: int) -> str:
    """The stored json of an entry; the seq lives in the member prefix and the score."""
    fields = {
        "t": entry.tool_name,
        "a": entry.args_hash,
        "c": entry.tool_call_id,
        "r": entry.run_id,
        "h": entry.result_hash,
        "u": entry.unknown_tool_name,
    }
    data: dict[str, str | int] = {k: v for k, v in fields.items() if v is not None}
    data["ts"] = now_ms
    return json.dumps(data, separators=(",", ":"))


def _parse_member(member: Any) -> HistoryEntry:
    seq, _, body = _text(member).partition("|")
    data = json.loads(body)
    data["s"] = int(seq)
    return HistoryEntry.from_dict(data)


class RedisLoopHistory:
    """Loop history in Redis; each protocol method is one atomic round trip."""

    def __init__(self, client: redis.Redis, *, prefix: str, ttl_s: int) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive: every key must expire")
        self._client = client
        self._prefix = prefix
        self._ttl_s = ttl_s
        self._record_call = load_script(client, "loop_record_call.lua", library=LOOP_STATE_LIBRARY)
        self._record_outcome = load_script(client, "loop_record_outcome.lua", library=LOOP_STATE_LIBRARY)
        self._discard = load_script(client, "loop_discard.lua", library=LOOP_STATE_LIBRARY)
        self._arm = load_script(client, "loop_guard_arm.lua")
        self._warning = load_script(client, "loop_warning.lua")
        self._touched: dict[RunScope, RunKeys] = {}

    @classmethod
    def on_ledger(cls, ledger: Ledger) -> RedisLoopHistory:
        """The history next to ``ledger``'s records: same client, prefix and TTL."""
        return cls(ledger.client, prefix=ledger.prefix, ttl_s=ledger.ttl_s)

    @classmethod
    def from_url(cls, url: str, *, prefix: str, ttl_s: int) -> RedisLoopHistory:
        """A history on its own client for ``url`` (the replay CLI); :meth:`close` releases it."""
        return cls(redis.Redis.from_url(url), prefix=prefix, ttl_s=ttl_s)

    def close(self) -> None:
        """Release the client's connections."""
        self._client.close()

    def _keys(self, scope: RunScope) -> RunKeys:
        keys = self._touched.get(scope)
        if keys is None:
            keys = self._touched[scope] = RunKeys(self._prefix, scope.session_key, scope.run_id)
        return keys

    def record_call(
        self, scope: RunScope, entry: HistoryEntry, history_size: int, now_ms: int
    ) -> tuple[list[HistoryEntry], int]:
        """Append a pending call; return the window it is judged against and its assigned seq."""
        seq, members = self._append(scope, entry, history_size, "window", 0, now_ms)
        return [_parse_member(member) for member in members], int(seq)

    def check_call(
        self, scope: RunScope, entry: HistoryEntry, history_size: int, evidence_at: int, now_ms: int
    ) -> tuple[WindowSignals, int]:
        """:meth:`record_call`, returning the window's signals (kept in Redis) instead of the window."""
        reply = json.loads(self._append(scope, entry, history_size, "signals", evidence_at, now_ms))
        seq, recent, stalled, latest, repeats, streak, name, count, a, b, tool, evidence = reply
        signals = WindowSignals(
            unknown_streak=int(streak),
            unknown_name=name or None,
            stalled=int(stalled),
            latest=latest if latest is not False else None,
            recent=int(recent),
            run_repeats=int(repeats),
            alternation=int(count),
            pair=(str(a), str(b)) if count else (),
            paired_tool=tool or None,
            evidence=bool(evidence),
        )
        return signals, int(seq)

    def _append(
        self, scope: RunScope, entry: HistoryEntry, size: int, mode: str, evidence_at: int, now_ms: int
    ) -> Any:
        keys = self._keys(scope)
        body = _entry_body(entry, now_ms)
        args = [size, body, self._ttl_s, now_ms, mode, evidence_at, entry.tool_name, entry.args_hash]
        try:
            return run_script(self._client, self._record_call, [keys.history, keys.loop_state], args)
        except redis.RedisError as exc:
            raise StoreError(f"loop history append failed: {exc}") from exc

    def discard_call(self, scope: RunScope, seq: int) -> None:
        """Remove a call appended by :meth:`record_call` that was then blocked."""
        keys = self._keys(scope)
        try:
            run_script(self._client, self._discard, [keys.history, keys.loop_state], [seq])
        except redis.RedisError as exc:
            raise StoreError(f"loop history discard failed: {exc}") from exc

    def record_outcome(
        self,
        scope: RunScope,
        entry: HistoryEntry,
        history_size: int | None,
        observe: GuardTriple | None,
        now_ms: int,
    ) -> tuple[GuardTriple, ...] | None:
        """Attach an outcome hash and feed the guard; return the guard window, or None if dormant."""
        keys = self._keys(scope)
        args = [
            "" if history_size is None else history_size,
            entry.tool_name,
            entry.args_hash,
            entry.tool_call_id or "",
            entry.result_hash or "",
            entry.unknown_tool_name or "",
            _entry_body(entry, now_ms),
            "" if observe is None else json.dumps(list(observe)),
            self._ttl_s,
            now_ms,
        ]
        try:
            window = run_script(
                self._client, self._record_outcome, [keys.history, keys.run, keys.loop_state], args
            )
        except redis.RedisError as exc:
            raise StoreError(f"loop outcome record failed: {exc}") from exc
        if not window:
            return None
        return tuple(_triple(line) for line in _text(window).split("\n"))

    def arm_guard(self, scope: RunScope, window_size: int, now_ms: int) -> None:
        """Arm (or re-arm) the post-compaction guard of a run for ``window_size`` outcomes."""
        try:
            self._arm(keys=[self._keys(scope).run], args=[window_size, self._ttl_s, now_ms])
        except redis.RedisError as exc:
            raise StoreError(f"guard arm failed: {exc}") from exc

    def disarm_guard(self, scope: RunScope) -> None:
        """Disarm the post-compaction guard of a run."""
        try:
            self._client.hdel(self._keys(scope).run, *_GUARD_FIELDS)
        except redis.RedisError as exc:
            raise StoreError(f"guard disarm failed: {exc}") from exc

    def note_warning(self, scope: RunScope, key: str, bucket: int, now_ms: int) -> bool:
        """Record a warning's bucket; True when it exceeds the last bucket (the warning is emitted)."""
        args = [key, bucket, WARNING_KEY_LIMIT, self._ttl_s]
        try:
            return bool(self._warning(keys=[self._keys(scope).run], args=args))
        except redis.RedisError as exc:
            raise StoreError(f"warning de-duplication failed: {exc}") from exc

    def delete_session(self, session_key: str) -> None:
        """Delete the keys this instance wrote for a throwaway session (the replay CLI, tests).

        Raises:
            StoreError: when Redis fails.
        """
        names = [
            name
            for scope in self._touched
            if scope.session_key == session_key
            for name in (
                RunKeys(self._prefix, scope.session_key, scope.run_id).history,
                RunKeys(self._prefix, scope.session_key, scope.run_id).loop_state,
                RunKeys(self._prefix, scope.session_key, scope.run_id).run,
            )
        ]
        if names:
            with store_errors():
                self._client.delete(*names)


def _triple(line: str) -> GuardTriple:
    tool, args_hash, result_hash = json.loads(line)
    return (str(tool), str(args_hash), str(result_hash))
