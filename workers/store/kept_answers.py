"""Kept until a replica holds it: answers handed on while the primary had no replica in sync.

Through the Sentinels, a primary with no replica in sync (a replica promoted while its old
primary is down) is written as a lone Redis is: availability first
(:mod:`workers.store.replica_acks`). What it takes then exists on that one node only. If it
fails over again before a replica has copied it (the old primary, back as its replica but
still loading, is promoted in its place), the promotion discards it: answers an agent was
handed vanish from the ledger, and the watchdog or a newer run may decide something else for
the same call (docs/failover.md, "Two failovers in a row", gives the figures).

So whoever hands an answer on (a gateway, ``unstuck serve``, ``unstuck mcp``, ``collect``)
keeps a copy when it read it with no replica's acknowledgement, and:

* drops it once a replica holds it: a fence (a ``PUBLISH``, replicated like a write, and
  ``WAIT 1``) on the same primary that comes back with a replica covers every write that
  primary took before it, the kept answer's included;
* writes it back when the Sentinels name another primary first (``answer_restore.lua``):
  where that primary lost it the answer is written again, replacing an answer decided there
  *after* the delivery (decided on a ledger that had lost the delivered one); an answer
  decided before the delivery is never replaced, and is counted as a conflict.

One thread per process does both, every ``redis.primary_check_interval_ms``, only while
something is kept (at most 100,000 answers, the oldest dropped first with a warning).
Counted in Redis (``P:kept_answers:restored`` and ``:conflict``) and exported as
``unstuck_answers_restored_total`` and ``unstuck_answers_restore_conflicts_total``.
What this cannot cover: a deliverer that dies (or is partitioned from every primary) while
it keeps an answer no replica holds, and the primary fails over before the replica copies it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import redis
from redis.sentinel import SentinelConnectionPool

from workers.core.models import ToolResult
from workers.store.connection import store_errors
from workers.store.keys import RunKeys, kept_answers_key
from workers.store.lua import script_source

__all__ = ["KeptAnswers", "kept_counts"]

log = logging.getLogger(__name__)

Address = tuple[str, int]
#: How long a fence may wait for a replica: short, the next tick asks again.
_FENCE_WAIT_MS = 100
#: What the counters count: answers written back, and answers that met another one decided first.
_OUTCOMES = ("restored", "conflict")
#: The most answers a process keeps: a primary that never gets a replica in sync (Sentinels
#: watching a lone Redis) would otherwise grow the list without end. The oldest go first.
_MOST_KEPT = 100_000
#: Who a written-back answer names as its writer (the record's ``writer``).
_WRITER = "kept-answer"


@dataclass
class _Kept:
    keys: RunKeys
    result: ToolResult
    delivered_ms: int
    primary: Address | None


class KeptAnswers:
    """This process's answers handed on without a replica's acknowledgement (module docstring).

    ``client``: a sync client through the Sentinels (built on first use); ``interval_s``: how
    often the keeper looks; ``ttl_s``: ``ledger.ttl_s`` for what it writes back.
    """

    def __init__(
        self,
        client: Callable[[], redis.Redis],
        *,
        prefix: str,
        ttl_s: int,
        interval_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client_of = client
        self._client: redis.Redis | None = None
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.interval_s = interval_s
        self._clock = clock
        self._kept: list[_Kept] = []
        self._lock = threading.Lock()
        self._thread_pid: int | None = None

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, keys: RunKeys, results: Mapping[str, ToolResult], primary: Address | None) -> None:
        """Keep ``results`` of ``keys``' run, handed on now, read from ``primary`` without a replica's ack."""
        if not results:
            return
        now_ms = int(self._clock() * 1000)
        with self._lock:
            self._kept.extend(_Kept(keys, result, now_ms, primary) for result in results.values())
            if len(self._kept) > _MOST_KEPT:
                del self._kept[: len(self._kept) - _MOST_KEPT]
                log.warning(
                    "%d answers handed on wait for a replica to hold them: the oldest are no longer"
                    " kept (does the primary have a replica? `unstuck config check`)",
                    _MOST_KEPT,
                )
            self._start()

    def _start(self) -> None:
        if self._thread_pid != os.getpid():
            self._thread_pid = os.getpid()
            threading.Thread(target=self._run, name="unstuck-kept-answers", daemon=True).start()

    def _run(self) -> None:
        while True:  # a daemon thread: it ends with its process
            time.sleep(self.interval_s)
            if not self._kept:
                continue
            try:
                self.settle()
            except redis.RedisError as exc:  # no primary yet: the next tick asks again
                log.debug("kept answers not settled yet: %s", exc)
            except Exception:  # the keeper outlives any one failure: it is all that holds them
                log.exception("kept answers could not be settled; trying again")

    def _redis(self) -> redis.Redis:
        if self._client is None:
            self._client = self._client_of()
        return self._client

    def settle(self) -> int:
        """Write back what another primary lost, drop what a replica holds; how many are still kept.

        Answers kept on another primary than the one named now are written back at once (the
        failover may have lost them). Before anything is dropped, every kept answer is checked
        on the named primary (written back where missing: an answer read from a node about to
        be demoted was never on it) and a fence behind those checks must hold, on a primary
        the Sentinels still name after it.
        """
        client = self._redis()
        named = _named_primary(client)
        with self._lock:
            kept = list(self._kept)
        moved = [k for k in kept if k.primary != named]
        if moved:
            self._restore(client, moved)
            for item in moved:
                item.primary = named
        if not _fence_holds(client):
            return len(kept)
        self._restore(client, kept)
        if not _fence_holds(client) or _named_primary(client) != named:
            return len(kept)
        with self._lock:
            held = {id(k) for k in kept}
            self._kept = [k for k in self._kept if id(k) not in held]
            return len(self._kept)

    def _restore(self, client: redis.Redis, items: list[_Kept]) -> None:
        """``answer_restore.lua`` for each of ``items``, in one round trip."""
        script = script_source("answer_restore.lua", with_summary=True)
        sha = client.script_load(script)
        pipe = client.pipeline(transaction=False)
        restored, conflict = (
            kept_answers_key(self.prefix, "restored"),
            kept_answers_key(self.prefix, "conflict"),
        )
        for item in items:
            result = item.result
            call_id = result.tool_call_id
            keys = [item.keys.call(call_id), item.keys.calls, restored, conflict, item.keys.run]
            args = [call_id, result.to_json(), result.reason or "", item.delivered_ms, self.ttl_s]
            pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args, _WRITER)  # type: ignore[no-untyped-call]
        # An open call answered now leaves the due and lease indexes, as after a finish.
        for item in items:
            member = item.keys.due_member(item.result.tool_call_id)
            pipe.zrem(item.keys.index.due, member)
            pipe.zrem(item.keys.index.leases, member)
        for item, outcome in zip(items, pipe.execute()[: len(items)], strict=True):
            where = f"call {item.result.tool_call_id!r} of {item.keys.session_key}/{item.keys.run_id}"
            if int(outcome) == 1:
                log.warning(
                    "the answer to %s was lost by a failover: written back as it was handed on", where
                )
            elif int(outcome) < 0:
                log.error(
                    "the answer to %s was lost by a failover, and the ledger holds another answer"
                    " decided before it was handed on: not written back",
                    where,
                )

    def after_fork_in_child(self) -> None:
        """A forked child keeps nothing of its parent's (it handed nothing on)."""
        self._lock = threading.Lock()
        self._kept = []
        self._client = None
        self._thread_pid = None


def _named_primary(client: redis.Redis) -> Address | None:
    """The primary the Sentinels name now (None: not through Sentinels)."""
    pool = client.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        return None
    host, port = pool.get_master_address()  # type: ignore[no-untyped-call]
    return (str(host), int(port))


def _fence_holds(client: redis.Redis) -> bool:
    """Whether a replica holds everything the primary took so far (a fence and ``WAIT 1``)."""
    pipe = client.pipeline(transaction=False)
    pipe.publish("unstuck:replica-fence", "1")
    pipe.execute_command("WAIT", 1, _FENCE_WAIT_MS)  # type: ignore[no-untyped-call]
    return int(pipe.execute()[-1]) >= 1


def kept_counts(client: redis.Redis, prefix: str) -> dict[str, int]:
    """Answers written back after a failover lost them, and conflicts (0 when none, or expired)."""
    with store_errors():
        pipe = client.pipeline(transaction=False)
        for outcome in _OUTCOMES:
            pipe.get(kept_answers_key(prefix, outcome))
        replies = pipe.execute()
    return {outcome: int(reply or 0) for outcome, reply in zip(_OUTCOMES, replies, strict=True)}
