"""Every Redis key unstuck uses is built here. No other module spells a key.

What each key holds, its TTL and why, and who writes and reads it is declared once per record
in :mod:`workers.store.records`; the table of every key in docs/architecture.md ("Redis keys")
is rendered from those declarations (``records.schema_table``), and a test holds the page to
them. ``P`` is ``Settings.redis.key_prefix`` (default ``unstuck``).

* **One slot per run.** All keys of one run share the hash tag ``{<session>/<run>}``
  (``{tag}``), so every script touches one slot and the store runs on Redis Cluster. Session
  keys, run ids and call ids are percent-quoted, so a ``{``, ``}``, ``:`` or ``/`` in them
  cannot break the tag or collide.
* **Index buckets.** The global indexes (calls by deadline and by lease expiry, runs by
  deadline, by progress and by end) are split into :data:`INDEX_BUCKETS` buckets (``{B}``),
  so that no shard takes every call's index writes. A run's bucket follows from its hash slot
  (:attr:`RunKeys.bucket`) and each bucket's tag (:func:`bucket_tag`) lies in the same share
  of the slot space, so a run's index writes mostly land on its own shard. The index keys are
  outside the run's slot: a script writes the run's keys and the command pipelined after it
  the index. Indexes are hints the watchdog re-checks against the records, so they never need
  to change atomically with them. ``due`` scores an unanswered call by its deadline, or by the
  sweep's first look one lease after submission when sooner; ``leases`` scores a claimed call
  by when its lease runs out, so a sweep finds lost workers by score. A call answered before
  that first look (most) never touches ``leases`` (``workers.core.waiting.past_first_look``).
* **Run summary.** The run record carries a summary of its calls (``progress_ms``, ``open_n``,
  ``claimed_n``) kept by the ledger scripts in the run's slot (``lib_run_summary.lua``), so a
  sweep reads one hash per due run and never its calls.
* **Sessions.** A lane outlives the runs that hold it in turn, so session keys get their own
  tag ``{S}``. Beginning or ending a run is three single-slot steps (lane, run record, its
  bucket's indexes), each atomic, ordered so that a crash in between leaves only what expires
  or what the watchdog repairs; on one node the steps that need no reply of the one before go
  in one round trip, which the primary runs in order (:func:`workers.store.lua.run_scripts`).
  Index members are ``S/<run>`` (:func:`run_member`) and ``S/<run>/<call>``
  (:meth:`RunKeys.due_member`): a run's member is its hash tag's content, so
  :func:`member_run_key` rebuilds keys from a member without unquoting.
* **Breakers.** A tool's shared circuit breaker keeps its keys under ``{breaker:<tool>}``:
  its scripts touch one slot, and the breaker is global across sessions, which is its point.
* **Scripts.** Every Lua script declares every key it touches in ``KEYS``, and every one but
  the sweep's touches one slot; the register script may also push the call's task message
  onto the broker queue's list, only when the broker is a plain Redis on the ledger's own node.
  The sweep's run script takes one bucket's page of members with their records' keys, across
  slots, which Redis Cluster refuses: there the sweep pipelines the same reads
  (:mod:`workers.store.sweep_scripts`); due calls are always probed that way. The sweep lock,
  the watchdog's record and ``P:events`` stay global: they are written per sweep or per rare
  event, never on a call's normal path.
"""

from __future__ import annotations

import re
import time
from binascii import crc_hqx
from dataclasses import dataclass
from functools import cache, cached_property
from itertools import count
from typing import Final, Literal
from urllib.parse import quote, unquote

__all__ = [
    "INDEX_BUCKETS",
    "KEY_PATTERNS",
    "REFRESH_INTERVAL_S",
    "BreakerKeys",
    "IndexKeys",
    "IndexTtl",
    "OpenClawKeys",
    "RunKeys",
    "SessionKeys",
    "all_index_keys",
    "broker_queue_key",
    "bucket_of",
    "bucket_tag",
    "duplicates_key",
    "events_stream_key",
    "index_keys",
    "kept_answers_key",
    "key_slot",
    "lane_pattern",
    "ledger_key_kind",
    "ledger_scan_pattern",
    "listener_poke_key",
    "member_bucket",
    "member_run_key",
    "parse_due_member",
    "parse_lane_key",
    "parse_run_member",
    "quote_part",
    "refused_key",
    "replica_fence_key",
    "run_member",
    "sweep_lock_key",
    "watchdog_key",
]

#: How many buckets each global index is split into. Changing it moves members between
#: buckets: a sweep would not find members left in the old ones until they expire.
INDEX_BUCKETS = 64
_SLOTS = 16384  # Redis Cluster's hash slots


def key_slot(tag: str) -> int:
    """The Redis Cluster hash slot of a hash tag's content (CRC16/XMODEM mod 16384)."""
    return crc_hqx(tag.encode(), 0) % _SLOTS


def bucket_of(tag: str) -> int:
    """The index bucket of the run whose hash tag's content is ``tag``."""
    return key_slot(tag) * INDEX_BUCKETS // _SLOTS


@cache
def bucket_tag(bucket: int) -> str:
    """Bucket ``bucket``'s hash tag content: the first ``ix<bucket>.<n>`` whose slot is in the bucket's range.

    The range is the bucket's share of the slot space, the same share :func:`bucket_of`
    maps runs from, so a bucket sits with most of its runs and buckets spread evenly.
    """
    low, high = bucket * _SLOTS // INDEX_BUCKETS, (bucket + 1) * _SLOTS // INDEX_BUCKETS
    for n in count():
        tag = f"ix{bucket}.{n}"
        if low <= key_slot(tag) < high:
            return tag
    raise AssertionError("unreachable: count() never ends")


@dataclass(frozen=True)
class IndexKeys:
    """The global indexes' keys in one bucket (one slot, tag ``{ix<b>.<n>}``)."""

    bucket: int
    due: str
    leases: str
    by_deadline: str
    by_progress: str
    ended: str


@cache
def index_keys(prefix: str, bucket: int) -> IndexKeys:
    """Bucket ``bucket``'s share of the global indexes.

    Unanswered calls by deadline (ms), claimed calls by lease expiry (ms), running runs by
    deadline and by last progress (ms), ended runs by end time (ms).
    """
    base = f"{prefix}:{{{bucket_tag(bucket)}}}"
    return IndexKeys(
        bucket, f"{base}:due", f"{base}:leases", f"{base}:by_deadline", f"{base}:by_progress", f"{base}:ended"
    )


def all_index_keys(prefix: str) -> list[IndexKeys]:
    """Every bucket's index keys, bucket 0 first."""
    return [index_keys(prefix, bucket) for bucket in range(INDEX_BUCKETS)]


# An index key only has to outlive the members written into it, so a process refreshes its TTL
# at most once per REFRESH_INTERVAL_S (an EXPIRE after each write was three of a call's
# commands) and sets it that much longer than ledger.ttl_s: a member written up to one
# interval after the last refresh still has its ttl_s ahead of it. Races between threads only
# cost an extra EXPIRE; a forked child's inherited memory still holds (the TTL is on the server).
#: How often one process refreshes one index key's TTL (and by how much it over-extends it).
REFRESH_INTERVAL_S = 60


class IndexTtl:
    """Remembers when this process last refreshed each index key's TTL."""

    def __init__(self, ttl_s: int) -> None:
        self.expire_s = ttl_s + REFRESH_INTERVAL_S
        self._next_refresh: dict[str, float] = {}

    def due(self, key: str) -> bool:
        """True when ``key``'s TTL should be refreshed now (then counted as refreshed)."""
        now = time.monotonic()
        if self._next_refresh.get(key, 0.0) > now:
            return False
        self._next_refresh[key] = now + REFRESH_INTERVAL_S
        return True

    def forget(self) -> None:
        """Refresh every key on its next write: a round trip that may have lost an EXPIRE failed."""
        self._next_refresh.clear()


def member_bucket(member: str) -> int:
    """The bucket of a run member (``S/R``) or a call member (``S/R/C``)."""
    session, run = member.split("/")[:2]
    return bucket_of(session + "/" + run)


def member_run_key(prefix: str, member: str) -> str:
    """The run record of a run member ``S/R`` (already quoted: its tag's content)."""
    return f"{prefix}:{{{member}}}:run"


_QUOTE_SAFE = "-_.~@"
# What ``quote`` leaves as it is: ASCII letters and digits, and the safe characters.
_UNQUOTED = re.compile(r"[A-Za-z0-9\-_.~@]*")


def quote_part(value: str) -> str:
    """Percent-quote one user-supplied key part so it cannot break the key grammar."""
    # Most parts (ids, uuids, names) need no quoting: the match costs a fifth of quote()'s encode
    # and table walk, and a call's keys quote about fifteen parts in the gateway alone.
    if _UNQUOTED.fullmatch(value):
        return value
    return quote(value, safe=_QUOTE_SAFE)


@dataclass(frozen=True)
class RunKeys:
    """Key builders for one run (session key + run id)."""

    prefix: str
    session_key: str
    run_id: str

    @cached_property
    def tag(self) -> str:  # cached: every key of the run is built from it, several per call
        """The cluster hash tag shared by every key of the run."""
        return "{" + quote_part(self.session_key) + "/" + quote_part(self.run_id) + "}"

    @property
    def bucket(self) -> int:
        """The index bucket of this run (see :func:`bucket_of`)."""
        return bucket_of(self.tag[1:-1])

    @property
    def index(self) -> IndexKeys:
        """The global indexes' keys in this run's bucket."""
        return index_keys(self.prefix, self.bucket)

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, self.tag, *parts))

    def call(self, call_id: str) -> str:
        """The call record hash."""
        return self._key("call", quote_part(call_id))

    def late(self, call_id: str) -> str:
        """Results that lost the first-writer race, kept for audit."""
        return self._key("late", quote_part(call_id))

    def lease(self, call_id: str) -> str:
        """The worker's lease on a running call."""
        return self._key("lease", quote_part(call_id))

    @property
    def calls(self) -> str:
        """Every call of the run, scored by submission time (ms)."""
        return self._key("calls")

    @property
    def done(self) -> str:
        """Wake-up list: ids of calls answered, for the waiting gateway."""
        return self._key("done")

    @property
    def history(self) -> str:
        """Rolling loop-detection history of the run."""
        return self._key("history")

    @property
    def loop_state(self) -> str:
        """The loop detector's counts and streaks over the run's history window."""
        return self._key("loops")

    @property
    def run(self) -> str:
        """The run record (status, deadline, guard state)."""
        return self._key("run")

    def due_member(self, call_id: str) -> str:
        """This call's member in the global due index."""
        return self.tag[1:-1] + "/" + quote_part(call_id)  # the tag's content: session/run, quoted


def events_stream_key(prefix: str) -> str:
    """Capped stream of significant events (synthetic answers, loop verdicts, alerts)."""
    return f"{prefix}:events"


def listener_poke_key(prefix: str, listener_id: str) -> str:
    """Pokes to an async gateway's done listener: added to its BLPOP so new runs join at once."""
    return f"{prefix}:listener:{quote_part(listener_id)}"


def broker_queue_key(queue: str) -> str:
    """A Redis broker's list of a queue's task messages (kombu's key for priority 0: the queue's name)."""
    return queue


def ledger_scan_pattern(prefix: str) -> str:
    """SCAN pattern matching every key with a hash tag: run, session and run-index keys."""
    return f"{prefix}:{{*"


def ledger_key_kind(key: str) -> Literal["call", "run"] | None:
    """What a key found by :func:`ledger_scan_pattern` holds: a call record, a run record or other.

    Quoting keeps ``}`` out of session keys, run ids and call ids, so the first ``}`` ends the tag.
    """
    rest = key[key.find("}") + 1 :]
    if rest.startswith(":call:"):
        return "call"
    return "run" if rest == ":run" else None


def parse_due_member(prefix: str, member: str) -> tuple[RunKeys, str]:
    """Split a due-index member back into the run's keys and the call id."""
    session, run, call = (unquote(part) for part in member.split("/"))
    return RunKeys(prefix, session, run), call


@dataclass(frozen=True)
class SessionKeys:
    """Key builders for one session: its lane lock and its fencing counter."""

    prefix: str
    session_key: str

    @property
    def tag(self) -> str:
        """The cluster hash tag of the session's own keys (not a run's tag)."""
        return "{" + quote_part(self.session_key) + "}"

    @property
    def lane(self) -> str:
        """The lane lock: which run holds the session, with its fencing token."""
        return ":".join((self.prefix, self.tag, "lane"))

    @property
    def fence(self) -> str:
        """The session's fencing counter (INCR per run begun)."""
        return ":".join((self.prefix, self.tag, "fence"))


def run_member(session_key: str, run_id: str) -> str:
    """A run's member in the run indexes."""
    return quote_part(session_key) + "/" + quote_part(run_id)


def parse_run_member(member: str) -> tuple[str, str]:
    """Split a run-index member back into (session key, run id)."""
    session, run = member.split("/")
    return unquote(session), unquote(run)


def lane_pattern(prefix: str) -> str:
    """SCAN pattern matching every session's lane key (operator commands only)."""
    return f"{prefix}:{{*}}:lane"


def parse_lane_key(prefix: str, key: str) -> str:
    """The session key of a lane key."""
    return unquote(key[len(prefix) + 2 : -len("}:lane")])


def sweep_lock_key(prefix: str) -> str:
    """The lock that lets one watchdog sweep run at a time, whichever beat sent it."""
    return f"{prefix}:{{runs}}:sweep_lock"


def watchdog_key(prefix: str) -> str:
    """The watchdog's own liveness: when the last sweep completed and the gap before it."""
    return f"{prefix}:{{runs}}:watchdog"


@dataclass(frozen=True)
class BreakerKeys:
    """The keys of one tool's shared circuit breaker (one slot: ``{breaker:<tool>}``)."""

    prefix: str
    tool: str

    @property
    def state(self) -> str:
        """HASH: the breaker's state, since when, probes let through, generation."""
        return f"{self.prefix}:{{breaker:{quote_part(self.tool)}}}:state"

    @property
    def failures(self) -> str:
        """ZSET: the tool's recent failures (member: the call, score: when it failed)."""
        return f"{self.prefix}:{{breaker:{quote_part(self.tool)}}}:failures"


def replica_fence_key(key: str) -> str:
    """The fence key of ``key``'s slot (``key`` is one of a run's keys: the first ``}`` ends its tag).

    On Redis Cluster a deciding write or a fenced read writes it, then WAITs on the same
    connection: the replicas holding it hold every write to the slot before it.
    """
    return key[: key.index("}") + 1] + ":replica_fence"


def refused_key(prefix: str) -> str:
    """Counters of the task messages workers refused, by reason (see :mod:`workers.core.refusal`)."""
    return f"{prefix}:refused"


def kept_answers_key(prefix: str, outcome: str) -> str:
    """Counter of delivered answers a failover lost, by ``outcome``: ``restored`` or ``conflict``."""
    return f"{prefix}:kept_answers:{outcome}"


def duplicates_key(prefix: str) -> str:
    """Counter of second executions: calls a worker claimed again after an earlier attempt."""
    return f"{prefix}:duplicates"


@dataclass(frozen=True)
class OpenClawKeys:
    """OpenClaw's own calls (reported by its plugin): one slot, ``{openclaw}``.

    They are few (one per OpenClaw tool call, not per unstuck task), so one slot keeps every
    update a single-slot script on Redis Cluster too.
    """

    prefix: str

    def call(self, session_key: str, call_id: str) -> str:
        """One call's record."""
        return f"{self.prefix}:{{openclaw}}:call:{self.member(session_key, call_id)}"

    @property
    def open(self) -> str:
        """Open calls: member ``S/C``, score the deadline ms."""
        return f"{self.prefix}:{{openclaw}}:open"

    @property
    def activity(self) -> str:
        """Sessions: member the quoted session key, score its latest reported activity ms."""
        return f"{self.prefix}:{{openclaw}}:activity"

    @property
    def streams(self) -> str:
        """Model calls in flight: member ``S/R`` (session, run), score when the model call started ms."""
        return f"{self.prefix}:{{openclaw}}:streams"

    @property
    def tombstones(self) -> str:
        """Sessions OpenClaw's restart recovery tombstoned, alerted once: member ``S/I`` (key, session id)."""
        return f"{self.prefix}:{{openclaw}}:tombstones"

    @staticmethod
    def member(session_key: str, call_id: str) -> str:
        """The open-calls member of a call: ``S/C``, both quoted."""
        return f"{quote_part(session_key)}/{quote_part(call_id)}"

    @staticmethod
    def parse_member(member: str) -> tuple[str, str]:
        """(session, call id) of an open-calls member."""
        session, call = (unquote(part) for part in member.split("/"))
        return session, call


#: The key each builder above makes, as docs/architecture.md's table shows it (``P`` the prefix,
#: ``{tag}`` a run's hash tag, ``{S}`` a session's, ``{B}`` an index bucket's); what the key holds
#: is declared in :mod:`workers.store.records`, and a test holds each pattern to its builder.
KEY_PATTERNS: Final = {
    "RunKeys.call": "P:{tag}:call:<call>",
    "RunKeys.late": "P:{tag}:late:<call>",
    "RunKeys.lease": "P:{tag}:lease:<call>",
    "RunKeys.calls": "P:{tag}:calls",
    "RunKeys.done": "P:{tag}:done",
    "RunKeys.history": "P:{tag}:history",
    "RunKeys.loop_state": "P:{tag}:loops",
    "RunKeys.run": "P:{tag}:run",
    "replica_fence_key": "P:{tag}:replica_fence",
    "SessionKeys.lane": "P:{S}:lane",
    "SessionKeys.fence": "P:{S}:fence",
    "index_keys.due": "P:{B}:due",
    "index_keys.leases": "P:{B}:leases",
    "index_keys.by_deadline": "P:{B}:by_deadline",
    "index_keys.by_progress": "P:{B}:by_progress",
    "index_keys.ended": "P:{B}:ended",
    "events_stream_key": "P:events",
    "sweep_lock_key": "P:{runs}:sweep_lock",
    "watchdog_key": "P:{runs}:watchdog",
    "listener_poke_key": "P:listener:<id>",
    "BreakerKeys.state": "P:{breaker:<tool>}:state",
    "BreakerKeys.failures": "P:{breaker:<tool>}:failures",
    "refused_key": "P:refused",
    "duplicates_key": "P:duplicates",
    "OpenClawKeys.call": "P:{openclaw}:call:<session>/<call>",
    "OpenClawKeys.open": "P:{openclaw}:open",
    "OpenClawKeys.activity": "P:{openclaw}:activity",
    "OpenClawKeys.streams": "P:{openclaw}:streams",
    "OpenClawKeys.tombstones": "P:{openclaw}:tombstones",
    "kept_answers_key": "P:kept_answers:<outcome>",
    "broker_queue_key": "<queue>",
}
