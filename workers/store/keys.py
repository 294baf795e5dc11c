"""Every Redis key unstuck uses is built here. No other module spells a key.

All keys of one run share the hash tag ``{<session>/<run>}`` so that every multi-key
script touches one slot and the store can run on Redis Cluster. Session keys, run ids
and call ids are percent-quoted, so a ``{``, ``}``, ``:`` or ``/`` in them cannot
break the tag or collide.

=================================  ======  ===============  ==================  ======================
key                                type    TTL              written by          read by
=================================  ======  ===============  ==================  ======================
``P:{tag}:call:<call>``            HASH    ledger.ttl_s     gateway (register), gateway, collect,
                                           past its         worker (claim,      watchdog, CLI
                                           deadline, set    heartbeat, finish)
                                           by register (*)
``P:{tag}:late:<call>``            LIST    ledger.ttl_s     finish script       audit / CLI
``P:{tag}:lease:<call>``           STRING  lease.ttl_s      worker child        gateway, watchdog
                                                            (claim), worker
                                                            main (renew)
``P:{tag}:calls``                  ZSET    ledger.ttl_s     register script     collect, CLI
                                           + 120 s (**)     (finish: calls
                                                            never registered)
``P:{tag}:done``                   LIST    as ``calls``     finish script       gateway (BLPOP wake-up
                                           (**)             (result + call id,  carrying the answer)
                                                            see (***))
``P:{tag}:history``                ZSET    loops.ttl_s      loop-check script   loop-check script
                                           (0.9-1x: see
                                           its ttl_ms)
``P:{tag}:loops``                  HASH    as ``history``   loop-check script   loop-check script
``P:{tag}:run``                    HASH    ledger.ttl_s     gateway, watchdog,  gateway, watchdog, CLI
                                                            worker (progress
                                                            on claim, beat,
                                                            finish)
``P:{B}:due``                      ZSET    ledger.ttl_s     register (hint),    watchdog
                                           + 60 s, reset    finish, watchdog
                                           at most once a
                                           minute per
                                           process (see
                                           index_ttl)
``P:{B}:leases``                   ZSET    as ``due``       worker (a late      watchdog
                                                            claim, renew XX
                                                            GT), finish
                                                            (remove), watchdog
                                                            (first look adds;
                                                            re-score or drop)
``P:events``                       STREAM  ledger.ttl_s,    finish (synthetic   unstuck up
                                           refreshed on     winners), gateway
                                           every write;     (loop verdicts),
                                           MAXLEN ~10000    watchdog (alerts)
``P:{S}:lane``                     HASH    PEXPIREAT the    sessions (begin,    gateway (fence),
                                           run's deadline   end, release)       watchdog, CLI
                                           + 60 s (lease)
``P:{S}:fence``                    STRING  ledger.ttl_s     sessions (INCR on   sessions
                                                            begin)
``P:{B}:by_deadline``              ZSET    ledger.ttl_s,    sessions (begin),   watchdog, CLI
                                           refreshed on     watchdog (members
                                           begin            leave on run end)
``P:{B}:by_progress``              ZSET    ledger.ttl_s,    sessions (begin,    watchdog, CLI
                                           refreshed on     touch), watchdog
                                           begin
``P:{B}:ended``                    ZSET    ledger.ttl_s,    sessions (end;      CLI
                                           refreshed on     older members
                                           end              trimmed)
``P:{tag}:replica_fence``          STRING  PX 60 s          a deciding write    nobody (its WAIT
                                                            or fenced read on   covers the slot's
                                                            Redis Cluster       writes before it)
``P:{runs}:sweep_lock``            STRING  PX (3 sweep      watchdog sweep      watchdog sweep
                                           intervals)       (SET NX)
``P:listener:<id>``                LIST    60 s, refreshed  async gateway       the same process's
                                           on every poke    (pokes its own      done listener
                                                            listener)           (BLPOP)
``P:{runs}:watchdog``              HASH    7 days,          watchdog (each      metrics, CLI,
                                           refreshed on     completed sweep)    chaos soak
                                           every sweep
``P:{breaker:<tool>}:state``       HASH    breaker          gateway (breaker    gateway, CLI,
                                           window +         scripts)            metrics
                                           cooldown, on
                                           every write
``P:{breaker:<tool>}:failures``    ZSET    same             gateway (breaker    breaker script
                                                            failure script)
``P:refused``                      HASH    ledger.ttl_s,    worker (refused     metrics
                                           refreshed on     task messages)
                                           every write
``P:duplicates``                   STRING  ledger.ttl_s,    worker (a call      metrics
                                           refreshed on     claimed again:
                                           every write      INCR)
``<broker.queue>``                 LIST    none (kombu's)   async gateway       tool workers (Celery
                                                            (invoke messages,   BRPOP); not under P:
                                                            kombu's format)     the broker's own key
=================================  ======  ===============  ==================  ======================

(*) Register gives a call record ``ledger.ttl_s`` past its deadline, plus 60 s for clocks that
disagree, so claim and finish need not extend it: a record lives at least ``ledger.ttl_s``
after it is answered. Only a finish past the deadline sets ``ledger.ttl_s`` again.

(**) A run's ``calls`` key gets ``ledger.ttl_s`` + 120 s from a registration whose run
record's ``keys_ttl_ms`` is a minute old or more (or missing: no run record, then every
registration sets it), which then records the time: every key written within that minute
still has ``ledger.ttl_s`` ahead of it. ``done`` likewise from a finish, by ``done_ttl_ms``.
``calls`` never empties (no call leaves it). There is no set of a run's open calls: a call is
open while its record's state is not ``done``, and the run summary counts them (``open_n``).
``done`` empties on every wake-up, so the push that creates it (``RPUSH`` returns 1, in finish
or in a waiter's hand-back) sets its TTL too.

(***) A ``done`` entry is the winning result's JSON, U+001F, then the call id
(:mod:`workers.store.done_signals`; older workers pushed the bare id; a waiter handing it
to the run's other waiters pushes it again behind a NUL), so its waiter needs no read of the
record. A result so sits twice for a moment, in the record and in the list until
popped; a list nobody pops expires with it by the ``done`` TTL above.

What each key holds is declared in :mod:`workers.store.records`, one declaration per row of
this table: the fields of the seven HASHes (``CALL``, ``RUN``, ``LANE``, ``WATCHDOG``,
``BREAKER``, ``LOOPS``, ``REFUSED``) with their types, defaults and TTL rule, and the members, scores,
entries or value of the other keys (``KEY_RECORDS``). A test holds the two to the same rows.

``P`` is ``Settings.redis.key_prefix`` (default ``unstuck``). ``B`` is one of
:data:`INDEX_BUCKETS` index buckets: the global indexes (calls by deadline and by lease
expiry, runs by deadline, by progress and by end) are split into buckets so that, on Redis
Cluster, no single shard takes every call's index writes. A run's bucket follows from its
hash tag (:attr:`RunKeys.bucket`: the run's hash slot scaled to the bucket count), and each
bucket's tag (:func:`bucket_tag`) is chosen so its slot lies in the same share of the slot
space: the buckets spread evenly over any cluster whose masters own even slot ranges, and a
run's index writes mostly land on the run's own shard (one round trip for the pipeline that
carries a script and its index update). The index keys are outside the run's slot, so each
script writes the run's keys and the pipelined command after it the index: indexes are
hints the watchdog re-checks against the ledger, so they never need to change atomically
with a run's keys. ``B:due`` scores every unanswered call by its deadline, or by the sweep's
first look one lease after submission when that is sooner; ``B:leases`` scores a claimed call
by when its worker's lease runs out (as last written), so a sweep finds lost workers by score
(O(due)) instead of probing every lease. A call is put in ``B:leases`` by that first look
(which finds it running) or by a claim later than half a lease after submission, and is
removed by an answer after that: a call answered sooner (most) never touches ``B:leases``
and costs the indexes one write and one removal (``workers.core.waiting.past_first_look``).
The sweep works bucket by bucket (:func:`all_index_keys`).

The run record carries a summary of its calls, kept by the ledger scripts in the run's
own slot (``lib_run_summary.lua``), so that a sweep reads one hash per due run and never
its calls: ``progress_ms`` is the latest activity (raised by the gateway's
``touch_progress`` and by register, claim, heartbeat and finish; never lowered),
``open_n`` counts calls without a result and ``claimed_n`` calls a worker claimed and has
not answered. None of them is written when the run record does not exist.

Session lanes (``S`` is the percent-quoted session key) cannot share a run's tag: a lane
outlives the runs that hold it in turn. So session keys get their own tag ``{S}``. On Redis
Cluster that makes beginning or ending a run three single-slot steps (lane, run record,
its bucket's run indexes), not one transaction; each step is atomic on its own, they are
ordered so a crash in between leaves only what expires or what the watchdog repairs, and
the indexes are hints re-checked against the run record. Index members are ``S/<run>``
(see :func:`run_member`) and ``S/<run>/<call>`` (:meth:`RunKeys.due_member`): the member
of a run is exactly its hash tag's content, so :func:`member_run_key` and
:func:`member_call_keys` rebuild a run's keys from a member without unquoting.

A tool's shared circuit breaker (``tools.breakers``) keeps its two keys under the tag
``{breaker:<tool>}`` (the tool name percent-quoted), so its scripts touch one slot; the
breaker is global across sessions, which is its point.

Every Lua script declares every key it touches in ``KEYS``, and every script but the
sweep's touches one run's (or one session's, or one bucket's) slot; the register script may
also push the call's task message onto the broker queue's list, only when the broker is a
plain Redis on the ledger's own single node (never on a cluster client). The sweep's scripts
(``sweep_calls.lua``, ``sweep_runs.lua``) take one bucket's page of members with the keys
of their records; those keys span many slots, which a single Redis node allows and Redis
Cluster refuses, so on a cluster client the sweep pipelines the same reads instead (see
:mod:`workers.store.sweep_scripts`). The sweep lock and the watchdog's own record stay
global (tag ``{runs}``): they are written once per sweep, not per call; so is ``P:events``,
written per synthetic answer, loop verdict or alert, never on a call's normal path.
"""

from __future__ import annotations

from binascii import crc_hqx
from dataclasses import dataclass
from functools import cache, cached_property
from itertools import count
from typing import Literal
from urllib.parse import quote, unquote

__all__ = [
    "INDEX_BUCKETS",
    "BreakerKeys",
    "IndexKeys",
    "RunKeys",
    "SessionKeys",
    "all_index_keys",
    "broker_queue_key",
    "bucket_of",
    "bucket_tag",
    "duplicates_key",
    "events_stream_key",
    "index_keys",
    "key_slot",
    "lane_pattern",
    "ledger_key_kind",
    "ledger_scan_pattern",
    "listener_poke_key",
    "member_bucket",
    "member_call_keys",
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


def member_bucket(member: str) -> int:
    """The bucket of a run member (``S/R``) or a call member (``S/R/C``)."""
    session, run = member.split("/")[:2]
    return bucket_of(session + "/" + run)


def member_run_key(prefix: str, member: str) -> str:
    """The run record of a run member ``S/R`` (already quoted: its tag's content)."""
    return f"{prefix}:{{{member}}}:run"


def member_call_keys(prefix: str, member: str) -> tuple[str, str]:
    """The call record and lease keys of a call member ``S/R/C`` (parts already quoted)."""
    run, _, call = member.rpartition("/")
    base = f"{prefix}:{{{run}}}"
    return f"{base}:call:{call}", f"{base}:lease:{call}"


def quote_part(value: str) -> str:
    """Percent-quote one user-supplied key part so it cannot break the key grammar."""
    return quote(value, safe="-_.~@")


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
        return "/".join((quote_part(self.session_key), quote_part(self.run_id), quote_part(call_id)))


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
    """Counters of the task messages workers refused, by reason (see :mod:`workers.core.refusals`)."""
    return f"{prefix}:refused"


def duplicates_key(prefix: str) -> str:
    """Counter of second executions: calls a worker claimed again after an earlier attempt."""
    return f"{prefix}:duplicates"
