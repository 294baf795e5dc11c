"""Every Redis key unstuck uses is built here. No other module spells a key.

All keys of one run share the hash tag ``{<session>/<run>}`` so that every multi-key
script touches one slot and the store can run on Redis Cluster. Session keys, run ids
and call ids are percent-quoted, so a ``{``, ``}``, ``:`` or ``/`` in them cannot
break the tag or collide.

=================================  ======  ===============  ==================  ======================
key                                type    TTL              written by          read by
=================================  ======  ===============  ==================  ======================
``P:{tag}:call:<call>``            HASH    ledger.ttl_s     gateway (register), gateway, collect,
                                                            worker (claim,      watchdog, CLI
                                                            heartbeat, finish)
``P:{tag}:late:<call>``            LIST    ledger.ttl_s     finish script       audit / CLI
``P:{tag}:lease:<call>``           STRING  lease.ttl_s      worker child        gateway, watchdog
                                                            (claim), worker
                                                            main (renew)
``P:{tag}:calls``                  ZSET    ledger.ttl_s     register script     collect, CLI
``P:{tag}:open``                   ZSET    ledger.ttl_s     register / finish   gateway, watchdog
``P:{tag}:done``                   LIST    ledger.ttl_s     finish script       gateway (BLPOP wake-up)
``P:{tag}:history``                ZSET    loops.ttl_s      loop-check script   loop-check script
``P:{tag}:run``                    HASH    ledger.ttl_s     gateway, watchdog,  gateway, watchdog, CLI
                                                            worker (progress
                                                            on claim, beat,
                                                            finish)
``P:due``                          ZSET    ledger.ttl_s,    register (hint),    watchdog
                                           refreshed on     finish, watchdog
                                           every write
``P:leases``                       ZSET    ledger.ttl_s,    worker (claim,      watchdog
                                           refreshed on     renew XX GT),
                                           every write      finish (remove),
                                                            watchdog (re-score
                                                            or drop a hint)
``P:events``                       STREAM  ledger.ttl_s,    finish (synthetic   unstuck up
                                           refreshed on     winners), gateway
                                           every write;     (loop verdicts),
                                           MAXLEN ~10000    watchdog (alerts)
``P:{S}:lane``                     HASH    PEXPIREAT the    sessions (begin,    gateway (fence),
                                           run's deadline   end, release)       watchdog, CLI
                                           + 60 s (lease)
``P:{S}:fence``                    STRING  ledger.ttl_s     sessions (INCR on   sessions
                                                            begin)
``P:{runs}:by_deadline``           ZSET    ledger.ttl_s,    sessions (begin),   watchdog, CLI
                                           refreshed on     watchdog (members
                                           begin            leave on run end)
``P:{runs}:by_progress``           ZSET    ledger.ttl_s,    sessions (begin,    watchdog, CLI
                                           refreshed on     touch), watchdog
                                           begin
``P:{runs}:ended``                 ZSET    ledger.ttl_s,    sessions (end;      CLI
                                           refreshed on     older members
                                           end              trimmed)
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
=================================  ======  ===============  ==================  ======================

What each key holds is declared in :mod:`workers.store.records`, one declaration per row of
this table: the fields of the four HASHes (``CALL``, ``RUN``, ``LANE``, ``WATCHDOG``) with their
types, defaults and TTL rule, and the members, scores, entries or value of the other keys
(``KEY_RECORDS``). A test holds the two to the same rows.

``P`` is ``Settings.redis.key_prefix`` (default ``unstuck``). ``P:due`` and ``P:leases``
are the only call keys outside a run's slot; they are indexes that the watchdog re-checks
against the ledger, so they never need to change atomically with a run's keys. ``P:due``
scores every unanswered call by its deadline; ``P:leases`` scores every claimed call by
when its worker's lease runs out (as last written), so a sweep finds lost workers by score
(O(due)) instead of probing every lease.

The run record carries a summary of its calls, kept by the ledger scripts in the run's
own slot (``lib_run_summary.lua``), so that a sweep reads one hash per due run and never
its calls: ``progress_ms`` is the latest activity (raised by the gateway's
``touch_progress`` and by register, claim, heartbeat and finish; never lowered),
``open_n`` counts calls without a result and ``claimed_n`` calls a worker claimed and has
not answered. None of them is written when the run record does not exist.

Session lanes (``S`` is the percent-quoted session key) cannot share a run's tag: a lane
outlives the runs that hold it in turn. So session keys get their own tag ``{S}``, and the
run indexes share the tag ``{runs}``. On Redis Cluster that makes beginning or ending a run
three single-slot steps (lane, run record, indexes), not one transaction; each step is
atomic on its own, they are ordered so a crash in between leaves only what expires or what
the watchdog repairs, and the global indexes are hints re-checked against the run record.
Index members are ``S/<run>`` (see :func:`run_member`).

A tool's shared circuit breaker (``tools.breakers``) keeps its two keys under the tag
``{breaker:<tool>}`` (the tool name percent-quoted), so its scripts touch one slot; the
breaker is global across sessions, which is its point.

Single node only: the sweep's scripts ``sweep_calls.lua`` and ``sweep_runs.lua`` read the
keys of many runs in one script, rebuilding ``P:{S/<run>}:run|calls|open|call:<call>|
lease:<call>`` from index members exactly as :class:`RunKeys` spells them (members are
already quoted; call ids from ``calls``/``open`` are quoted as :func:`quote_part` does).
Redis Cluster refuses such scripts, so on a cluster client the sweep takes its pipelined
path (see :mod:`workers.store.sweep_scripts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal
from urllib.parse import quote, unquote

__all__ = [
    "BreakerKeys",
    "RunIndexKeys",
    "RunKeys",
    "SessionKeys",
    "due_index_key",
    "events_stream_key",
    "lane_pattern",
    "lease_index_key",
    "ledger_key_kind",
    "ledger_scan_pattern",
    "listener_poke_key",
    "parse_due_member",
    "parse_lane_key",
    "parse_run_member",
    "quote_part",
    "run_index_keys",
    "run_member",
    "sweep_lock_key",
    "watchdog_key",
]


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
    def tag(self) -> str:
        """The cluster hash tag shared by every key of the run (quoted once per instance)."""
        return "{" + quote_part(self.session_key) + "/" + quote_part(self.run_id) + "}"

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
    def open(self) -> str:
        """Unanswered calls of the run, scored by deadline (ms)."""
        return self._key("open")

    @property
    def done(self) -> str:
        """Wake-up list: ids of calls answered, for the waiting gateway."""
        return self._key("done")

    @property
    def history(self) -> str:
        """Rolling loop-detection history of the run."""
        return self._key("history")

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


def due_index_key(prefix: str) -> str:
    """Global index of unanswered calls by deadline (ms), across all runs."""
    return f"{prefix}:due"


def lease_index_key(prefix: str) -> str:
    """Global index of claimed calls by lease expiry (ms), across all runs; members as ``P:due``."""
    return f"{prefix}:leases"


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


@dataclass(frozen=True)
class RunIndexKeys:
    """The global run indexes (one slot, tag ``{runs}``)."""

    by_deadline: str
    by_progress: str
    ended: str


def run_index_keys(prefix: str) -> RunIndexKeys:
    """Running runs by deadline (ms) and by last progress (ms); ended runs by end time (ms)."""
    base = f"{prefix}:{{runs}}"
    return RunIndexKeys(f"{base}:by_deadline", f"{base}:by_progress", f"{base}:ended")


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
