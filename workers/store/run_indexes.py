"""A run's indexes: when its calls key may expire, and its place in its bucket's run indexes.

**The calls key** expires at an absolute time, so a registration sets its TTL once.

A call record lives ``ledger.ttl_s`` (plus a refresh interval and a second) past its deadline
(``ledger_register.lua``). The run's calls key, the index registration checks a call id
against (``ZADD NX``), must outlive every record it lists, so it expires at the same point
after the latest deadline among its calls, rounded up to a whole refresh interval: calls
registered within one interval share that time, and the register script sets ``PEXPIRE``
only when a call's time is later than the one the run record holds (``keys_until_ms``).

**The run indexes** of a run's bucket (by deadline, by progress, ended) are written when the
run begins and ends, by one script (``run_index.lua``), so the two or three writes stay
atomic in one command of the caller. They expire after their last write, given their TTL
once a refresh interval per process (:class:`IndexTtl`), when the ended index is trimmed too.
"""

from __future__ import annotations

from typing import Any

from workers.store.keys import REFRESH_INTERVAL_S, IndexTtl, RunKeys, run_member
from workers.store.lua import ScriptStep, load_script

__all__ = ["RunIndexes", "RunKeysTtl"]


class RunKeysTtl:
    """The absolute expiry of a run's calls key, from its calls' deadlines."""

    def __init__(self, ttl_s: int) -> None:
        self._step_ms = REFRESH_INTERVAL_S * 1000
        self._after_ms = ttl_s * 1000 + self._step_ms + 1000  # a record's TTL past its deadline

    def until_ms(self, deadline_ms: int) -> int:
        """When the calls key may expire, given a call with this deadline (ms, a step boundary)."""
        earliest = deadline_ms + self._after_ms
        return -(-earliest // self._step_ms) * self._step_ms


class RunIndexes:
    """The steps (``run_index.lua``) that write a run into and out of its bucket's run indexes."""

    def __init__(self, client: Any, ttl_s: int) -> None:
        self._ttl_s = ttl_s
        self._ttl = IndexTtl(ttl_s)
        self._script = load_script(client, "run_index.lua")

    def entering(self, keys: RunKeys, now_ms: int, *, deadline_ms: int) -> ScriptStep:
        """The run is running: by deadline (``deadline_ms``) and by progress (``now_ms``, never lowered).

        A step for :func:`~workers.store.lua.run_scripts`, sent with the run's own; when it
        fails, :meth:`failed`.
        """
        return self._step(keys, [deadline_ms, now_ms, "0"], trim=False)

    def leaving(self, keys: RunKeys, now_ms: int, *, ended: bool) -> ScriptStep:
        """The run leaves the running indexes; into the ended one (at ``now_ms``) when it ended."""
        return self._step(keys, ["", now_ms, "1" if ended else "0"], trim=True)

    def failed(self) -> None:
        """A round trip with a step of these indexes failed: the EXPIREs it carried may not have run."""
        self._ttl.forget()

    def _step(self, keys: RunKeys, args: list[Any], *, trim: bool) -> ScriptStep:
        index = keys.index
        # Entering writes the running indexes, leaving the ended one: each refreshes the TTL of
        # what it writes, and leaving trims the ended index, each once an interval per bucket.
        due = self._ttl.due(index.ended if trim else index.by_deadline)
        expire = [self._ttl.expire_s if due else "", args[1] - self._ttl_s * 1000 if due and trim else ""]
        return ScriptStep(
            self._script,
            [index.by_deadline, index.by_progress, index.ended],
            [run_member(keys.session_key, keys.run_id), *args, *expire],
        )
