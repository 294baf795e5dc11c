"""Every Redis record of the store, declared once: its key, type, TTL and why, writers, readers, fields.

:mod:`workers.store.keys` builds the keys; this module says what is inside them. Each HASH
record names its fields once, as a StrEnum (``CallField.SUBMITTED_MS``), with the field's type,
meaning and the decision a reader makes when the field is missing: a default, or
:class:`~workers.errors.StoreError`. Python readers and writers use those names, never string
literals, and read a hash by name (:class:`Row`: ``HMGET`` of a declared list zipped to names,
or ``HGETALL``), never by position. The table of every key in docs/architecture.md is rendered
from these declarations (:func:`schema_table`); ``tests/unit/test_records.py`` holds the page
to the rendering and each declared key pattern to what its builder makes. The Lua scripts
cannot import this module: that test also checks that every field a script names is declared
here, and ``tests/test_architecture.py`` that no Python module outside this one spells a field
name in a hash command.

Types: ``int ms`` (epoch milliseconds), ``int``, ``flag`` (``"1"``/``"0"``), ``str``,
``json`` and ``enum`` (the values of a StrEnum of the core). A malformed number reads like a
missing one, as the scripts' ``tonumber(x or 0) or 0`` does, so both paths of the sweep decide
alike.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, TypeVar

from workers.core.breaker import BreakerState
from workers.core.models import CallState, ToolResult
from workers.core.reaping import OpenCall
from workers.core.refusal import RefusalReason
from workers.core.run_health import RunStatus, SessionClass
from workers.errors import StoreError
from workers.store.keys import KEY_PATTERNS, RunKeys

__all__ = [
    "BREAKER",
    "CALL",
    "HASH_RECORDS",
    "KEY_RECORDS",
    "LANE",
    "LOOPS",
    "OPENCLAW_CALL",
    "OPEN_FIELDS",
    "REFUSED",
    "REQUIRED",
    "RUN",
    "WATCHDOG",
    "BreakerField",
    "CallField",
    "CallRecord",
    "EventField",
    "FieldSpec",
    "FieldType",
    "HashRecord",
    "KeyRecord",
    "LaneField",
    "LoopStateField",
    "OpenClawCallField",
    "Row",
    "RunField",
    "WatchdogField",
    "declared_field",
    "open_call",
    "pgid_field",
    "pgid_of",
    "reply_member",
    "schema_table",
]


class FieldType(enum.StrEnum):
    """How a field's value is spelled in Redis."""

    MS = "int ms"
    INT = "int"
    FLAG = "flag"
    STR = "str"
    JSON = "json"
    ENUM = "enum"


class _Required(enum.Enum):
    REQUIRED = "required"


REQUIRED: Final = _Required.REQUIRED
"""A field's "default" when a reader that finds it missing raises ``StoreError``."""

Default = int | str | _Required


@dataclass(frozen=True)
class FieldSpec:
    """One field: its type, what it means, and what a reader gets when it is missing."""

    kind: FieldType
    meaning: str
    default: Default = REQUIRED
    values: type[enum.StrEnum] | None = None  # the enum of an ENUM field


F = TypeVar("F", bound=enum.StrEnum)


@dataclass(frozen=True)
class HashRecord(Generic[F]):
    """A HASH key: where it lives, its TTL and why, who writes and reads it, and its fields.

    ``fields`` names each field once (a StrEnum member); ``families`` the fields built from a
    prefix (``prefix<part>``).
    """

    name: str
    builder: str  # its builder in keys.py, whose KEY_PATTERNS shows the key it makes
    ttl: str
    writers: str
    readers: str
    fields: Mapping[F, FieldSpec]
    families: Mapping[str, FieldSpec] = field(default_factory=dict)
    redis_type: Literal["HASH"] = "HASH"

    @property
    def key(self) -> str:
        """The key's pattern, as the table shows it."""
        return KEY_PATTERNS[self.builder]


@dataclass(frozen=True)
class KeyRecord:
    """A key that is not a HASH: where it lives, its TTL and why, who writes and reads it, what it holds."""

    name: str
    builder: str
    redis_type: Literal["ZSET", "SET", "LIST", "STREAM", "STRING"]
    ttl: str
    writers: str
    readers: str
    holds: str

    @property
    def key(self) -> str:
        """The key's pattern, as the table shows it."""
        return KEY_PATTERNS[self.builder]


def _ms(meaning: str, default: Default = 0) -> FieldSpec:
    return FieldSpec(FieldType.MS, meaning, default)


def _int(meaning: str, default: Default = 0) -> FieldSpec:
    return FieldSpec(FieldType.INT, meaning, default)


def _str(meaning: str, default: Default = "") -> FieldSpec:
    return FieldSpec(FieldType.STR, meaning, default)


# --- the call record -------------------------------------------------------------------------


class CallField(enum.StrEnum):
    """Fields of the call record (``RunKeys.call``)."""

    CALL_ID = "call_id"
    TOOL = "tool"
    AGENT_ID = "agent_id"
    STATE = "state"
    SUBMITTED_MS = "submitted_ms"
    DEADLINE_MS = "deadline_ms"
    ATTEMPT = "attempt"
    IDEMPOTENT = "idempotent"
    DISPATCHED = "dispatched"
    JOB = "job"
    JOB_DIGEST = "job_digest"
    TASK_ID = "task_id"
    REQUEUES = "requeues"
    REPUBLISHES = "republishes"
    QUEUED_MS = "queued_ms"
    STARTED_MS = "started_ms"
    HB_MS = "hb_ms"
    WORKER = "worker"
    PROGRESS = "progress"
    RESULT = "result"
    REASON = "reason"
    FINISHED_MS = "finished_ms"
    WRITER = "writer"
    CANCEL_MS = "cancel_ms"
    TRACEPARENT = "traceparent"
    TRACESTATE = "tracestate"
    CLAIM = "claim"
    REG = "reg"
    COUNTED = "counted"


CALL: Final = HashRecord[CallField](
    name="call",
    writers="gateway (register), worker (claim, heartbeat, finish)",
    readers="gateway, collect, watchdog, CLI",
    builder="RunKeys.call",
    ttl="ledger.ttl_s past the call's deadline (+ 60 s for clocks that disagree), set by register, so"
    " claim and finish need not extend it; only a finish past the deadline sets ledger.ttl_s again",
    fields={
        CallField.CALL_ID: _str("the call's id; present in every registered call", REQUIRED),
        CallField.TOOL: _str("the tool's name as the model sent it"),
        CallField.AGENT_ID: _str("the agent that submitted it"),
        CallField.STATE: FieldSpec(
            FieldType.ENUM,
            "pending (registered or requeued), running (claimed), done (answered)",
            CallState.PENDING,
            CallState,
        ),
        CallField.SUBMITTED_MS: _ms("registration; missing reads 0, long ago, for the sweep's probe"),
        CallField.DEADLINE_MS: _ms("answer by then; missing reads 0, overdue, for the sweep's probe"),
        CallField.ATTEMPT: _int("claims so far (0 until a worker claims it)"),
        CallField.IDEMPOTENT: FieldSpec(FieldType.FLAG, "the tool may run again after a lost worker", 0),
        CallField.DISPATCHED: FieldSpec(FieldType.FLAG, "the broker accepted its message", 0),
        CallField.JOB: FieldSpec(FieldType.JSON, "the CallJob, to dispatch it again", ""),
        CallField.JOB_DIGEST: _str(
            "job_digest of the JSON form of the CallJob registered to run (the form its message"
            " carries); a message whose digest differs runs nothing"
        ),
        CallField.TASK_ID: _str("the Celery task id of its latest message"),
        CallField.REQUEUES: _int(
            "times a gateway handed it back to the queue (lost worker, idempotent tool)"
        ),
        CallField.REPUBLISHES: _int(
            "times its unclaimed message was published again, by a gateway or a worker (ledger_republish.lua)"
        ),
        CallField.QUEUED_MS: _ms(
            "when it last went into a queue (requeue, republish); missing: at submission"
        ),
        CallField.STARTED_MS: _ms("latest claim; 0 before the first"),
        CallField.HB_MS: _ms("latest tool heartbeat (or the claim); 0 before it"),
        CallField.WORKER: _str("host:pid of the claiming worker child"),
        CallField.PROGRESS: FieldSpec(FieldType.JSON, "the tool's latest progress report", ""),
        CallField.RESULT: FieldSpec(FieldType.JSON, "the delivered ToolResult; absent while open", ""),
        CallField.REASON: _str("the SyntheticReason of a synthetic result, '' for the tool's own"),
        CallField.FINISHED_MS: _ms("when the delivered result was written; 0 while open"),
        CallField.WRITER: _str("who wrote the delivered result (worker id, gateway, watchdog)"),
        CallField.CANCEL_MS: _ms("when a cancel was first requested (ledger_cancel.lua); 0: never"),
        CallField.TRACEPARENT: _str(
            "W3C trace context of the call's execute_tool span (workers.tracing); absent when not traced"
        ),
        CallField.TRACESTATE: _str("W3C tracestate beside traceparent; absent when none"),
        CallField.CLAIM: _str("the nonce of the latest claim: that claim sent again is recognised as itself"),
        CallField.REG: _str("the nonce of the registration: that registration sent again is recognised"),
        CallField.COUNTED: FieldSpec(
            FieldType.FLAG,
            "its claim is in the run's claimed_n (set by the lease keeper, ledger_count_claim.lua;"
            " cleared by a requeue)",
            0,
        ),
    },
    families={"pgid:": FieldSpec(FieldType.FLAG, "pgid:<n> = 1: a process group the tool started", 0)},
)


def pgid_field(pgid: int) -> str:
    """The call-record field remembering one process group."""
    return f"pgid:{pgid}"


def pgid_of(name: str) -> int | None:
    """The process group a call-record field names, None for any other field."""
    prefix, _, number = name.partition(":")
    return int(number) if prefix + ":" in CALL.families and number.isdigit() else None


# --- the run record --------------------------------------------------------------------------


class RunField(enum.StrEnum):
    """Fields of the run record (``RunKeys.run``)."""

    STATUS = "status"
    AGENT_ID = "agent_id"
    TOKEN = "token"
    STARTED_MS = "started_ms"
    DEADLINE_MS = "deadline_ms"
    PROGRESS_MS = "progress_ms"
    OPEN_N = "open_n"
    CLAIMED_N = "claimed_n"
    KEYS_UNTIL_MS = "keys_until_ms"
    CLASS = "class"
    ENDED_MS = "ended_ms"
    END_REASON = "end_reason"
    ABORTED_MS = "aborted_ms"
    ABORT_DETECTOR = "abort_detector"
    ABORT_COUNT = "abort_count"
    ABORT_MESSAGE = "abort_message"
    AGENT_BEAT_MS = "agent_beat_ms"
    AGENT_BEAT_WHAT = "agent_beat_what"
    STREAM_IDLE_N = "stream_idle_n"
    STREAM_IDLE_MS = "stream_idle_ms"
    GUARD_REMAINING = "guard_remaining"
    GUARD_WINDOW = "guard_window"
    GUARD_ARMED_MS = "guard_armed_ms"
    LOOP_WARN_SEQ = "loop_warn_seq"
    LOOP_WARN_COUNT = "loop_warn_count"


RUN: Final = HashRecord[RunField](
    name="run",
    writers="gateway, watchdog, worker (progress on claim, beat, finish)",
    readers="gateway, watchdog, CLI",
    builder="RunKeys.run",
    ttl="ledger.ttl_s, set when opened or begun; the loop scripts only ever extend it",
    fields={
        RunField.STATUS: FieldSpec(
            FieldType.ENUM,
            "RunStatus; missing reads '': a record only the loop guard or the watchdog wrote, never"
            " running, so the sweep drops it",
            "",
            RunStatus,
        ),
        RunField.AGENT_ID: _str("the agent that opened the run"),
        RunField.TOKEN: _int("the lane's fencing token the run began under; 0 before begin_run"),
        RunField.STARTED_MS: _ms("when the run was opened; 0 for a record no gateway opened"),
        RunField.DEADLINE_MS: _ms(
            "when the watchdog times the run out, set once (the by_deadline score mirrors it); 0: no deadline"
        ),
        RunField.PROGRESS_MS: _ms(
            "latest activity of the run or any call (never lowered, never before started_ms once"
            " begun: sweep_runs.lua reads it alone); 0: none"
        ),
        RunField.OPEN_N: _int("calls without a result (summary kept by lib_run_summary.lua)"),
        RunField.CLAIMED_N: _int("calls claimed and not answered (summary kept by lib_run_summary.lua)"),
        RunField.KEYS_UNTIL_MS: _ms(
            "when the run's calls key expires, as a registration last set it (run_indexes.RunKeysTtl);"
            " a registration whose time is not later skips its PEXPIRE; 0: always set it"
        ),
        RunField.CLASS: FieldSpec(
            FieldType.ENUM, "the watchdog's latest SessionClass; '' before its first look", "", SessionClass
        ),
        RunField.ENDED_MS: _ms("when the run ended; 0 while running"),
        RunField.END_REASON: _str("why it ended (superseded, a detector, a SyntheticReason)"),
        RunField.ABORTED_MS: _ms("when the loop detector aborted it"),
        RunField.ABORT_DETECTOR: _str("the loop detector that aborted it; '' when none did"),
        RunField.ABORT_COUNT: _int("the detector's repeat count at the abort"),
        RunField.ABORT_MESSAGE: _str("the detector's message"),
        RunField.AGENT_BEAT_MS: _ms("the agent's own latest heartbeat"),
        RunField.AGENT_BEAT_WHAT: _str("what the agent said it was doing (<= 64 chars)"),
        RunField.STREAM_IDLE_N: _int("model streams that went idle past their timeout"),
        RunField.STREAM_IDLE_MS: _ms("when the latest of those went idle"),
        RunField.GUARD_REMAINING: _int("outcomes the post-compaction guard still watches; 0: disarmed"),
        RunField.GUARD_WINDOW: _str("observed [tool, argsHash, resultHash] JSON triples, one a line"),
        RunField.GUARD_ARMED_MS: _ms("when the guard was last armed"),
        RunField.LOOP_WARN_SEQ: _int("insertion counter of the loop_warn: fields"),
        RunField.LOOP_WARN_COUNT: _int("loop_warn: fields held (at most WARNING_KEY_LIMIT)"),
    },
    families={
        "loop_warn:": _str("loop_warn:<warning key> = '<insertion seq>:<last bucket>' (de-duplication)")
    },
)


# --- the session lane and the watchdog's own record ------------------------------------------


class LaneField(enum.StrEnum):
    """Fields of a session's lane (``SessionKeys.lane``)."""

    RUN_ID = "run_id"
    TOKEN = "token"
    AGENT_ID = "agent_id"
    SINCE_MS = "since_ms"
    LEASE_UNTIL_MS = "lease_until_ms"


LANE: Final = HashRecord[LaneField](
    name="lane",
    writers="sessions (begin, end, release)",
    readers="gateway (fence), watchdog, CLI",
    builder="SessionKeys.lane",
    ttl="PEXPIREAT the holder's deadline + 60 s (lease_until_ms): a lane frees itself when its holder dies",
    fields={
        LaneField.RUN_ID: _str("the run holding the lane; every lane has one", REQUIRED),
        LaneField.TOKEN: _int("its fencing token (> 0, strictly increasing per session)", REQUIRED),
        LaneField.AGENT_ID: _str("the holder's agent"),
        LaneField.SINCE_MS: _ms("when the holder took the lane"),
        LaneField.LEASE_UNTIL_MS: _ms("when the lane frees itself (its key's expiry)"),
    },
)


class WatchdogField(enum.StrEnum):
    """Fields of the watchdog's own record (``watchdog_key``)."""

    LAST_SWEEP_MS = "last_sweep_ms"
    LAST_GAP_MS = "last_gap_ms"
    MAX_GAP_MS = "max_gap_ms"
    SWEEPS = "sweeps"


WATCHDOG: Final = HashRecord[WatchdogField](
    name="watchdog",
    writers="watchdog (each completed sweep)",
    readers="metrics, CLI, chaos soak",
    builder="watchdog_key",
    ttl="7 days (RECORD_TTL_MS), refreshed by every completed sweep",
    fields={
        WatchdogField.LAST_SWEEP_MS: _ms(
            "when the latest sweep completed; a record without it is no record (None, never 0)", REQUIRED
        ),
        WatchdogField.LAST_GAP_MS: _ms("the gap before the latest sweep; -1 for the first", -1),
        WatchdogField.MAX_GAP_MS: _ms("the longest gap seen"),
        WatchdogField.SWEEPS: _int("completed sweeps"),
    },
)


class BreakerField(enum.StrEnum):
    """Fields of a tool's circuit breaker (``BreakerKeys.state``)."""

    STATE = "state"
    SINCE_MS = "since_ms"
    PROBES = "probes"
    GENERATION = "generation"


BREAKER: Final = HashRecord[BreakerField](
    name="breaker",
    writers="gateway (breaker scripts)",
    readers="gateway, CLI, metrics",
    builder="BreakerKeys.state",
    ttl="the tool's window_s + cooldown_s, set on every write",
    fields={
        BreakerField.STATE: FieldSpec(
            FieldType.ENUM, "BreakerState; missing reads closed", BreakerState.CLOSED, BreakerState
        ),
        BreakerField.SINCE_MS: _ms("when it entered its state; 0 for a breaker never opened"),
        BreakerField.PROBES: _int("probes let through in the current half-open period"),
        BreakerField.GENERATION: _int("bumped by every transition (compare-and-set token); 0: never written"),
    },
)


class LoopStateField(enum.StrEnum):
    """Fields of a run's loop-detector state (``RunKeys.loop_state``); see lib_loop_state.lua."""

    SIZE = "size"
    RES = "res"
    DIST = "dist"
    ALT = "alt"
    ALT_PREV = "alt_prev"
    ALT_SEQ = "alt_seq"
    TTL_MS = "ttl_ms"


_CALL_PAIR = "<call> is '<#tool>:<tool><argsHash>' (length-prefixed)"

LOOPS: Final = HashRecord[LoopStateField](
    name="loops",
    writers="loop-check script",
    readers="loop-check script",
    builder="RunKeys.loop_state",
    ttl="loops.ttl_s, refreshed with the history when ttl_ms is a tenth of it old",
    fields={
        LoopStateField.SIZE: _int("the history size the state describes; missing or other: rebuilt"),
        LoopStateField.RES: _int("outcomes in the window"),
        LoopStateField.DIST: _int("distinct (tool, argsHash, resultHash) triples among them"),
        LoopStateField.ALT: _str("the alternating tail, JSON {l, a, b, t}"),
        LoopStateField.ALT_PREV: _str("alt before the append of record alt_seq (restored on discard)"),
        LoopStateField.ALT_SEQ: _int("the seq whose append produced alt"),
        LoopStateField.TTL_MS: _ms("when a check last refreshed this hash's and the history's TTLs"),
    },
    families={
        "n:": _int(f"n:<call> records of the call in the window; {_CALL_PAIR}"),
        "m:": _int("m:<call> those with an outcome"),
        "k:": _int("k:<call> newest outcomes of the call in a row with one result hash"),
        "h:": _str("h:<call> that result hash"),
        "s:": _int("s:<call> seq of the newest record of the call with an outcome"),
        "x:": _int("x:<triple> outcomes of that (tool, argsHash, resultHash) in the window"),
    },
)

REFUSED: Final = HashRecord[RefusalReason](
    name="refused",
    writers="worker (refused task messages)",
    readers="metrics",
    builder="refused_key",
    ttl="ledger.ttl_s, refreshed on every refusal",
    fields={reason: _int(f"task messages workers refused as {reason.value}") for reason in RefusalReason},
)


class OpenClawCallField(enum.StrEnum):
    """An OpenClaw tool call reported by its plugin (:mod:`workers.store.openclaw_calls`)."""

    SESSION = "session_key"
    RUN = "run_id"
    AGENT_ID = "agent_id"
    TOOL = "tool"
    CALL_ID = "call_id"
    PARAMS = "params_json"
    ARGS_HASH = "args_hash"
    STARTED_MS = "started_ms"
    DEADLINE_MS = "deadline_ms"
    STATE = "state"
    ENDED_MS = "ended_ms"


OPENCLAW_CALL: Final = HashRecord[OpenClawCallField](
    name="openclaw_call",
    writers="HTTP door (the plugin's start and end), watchdog (killed, aborted)",
    readers="HTTP door, watchdog, CLI",
    builder="OpenClawKeys.call",
    ttl="ledger.ttl_s, set on start",
    fields={
        OpenClawCallField.SESSION: _str("OpenClaw's session key", REQUIRED),
        OpenClawCallField.RUN: _str("OpenClaw's run id"),
        OpenClawCallField.AGENT_ID: _str("the unstuck agent whose loop settings apply"),
        OpenClawCallField.TOOL: _str("OpenClaw's tool name"),
        OpenClawCallField.CALL_ID: _str("the call id the plugin's hook saw", REQUIRED),
        OpenClawCallField.PARAMS: _str("the call's params, JSON, for the outcome hash"),
        OpenClawCallField.ARGS_HASH: _str("the loop detector's hash of the params"),
        OpenClawCallField.STARTED_MS: _ms("when the plugin reported the start"),
        OpenClawCallField.DEADLINE_MS: _ms("start plus openclaw.budgets_s of the tool"),
        OpenClawCallField.STATE: _str(
            "open, done, failed, blocked, killed or aborted (first end wins)", "open"
        ),
        OpenClawCallField.ENDED_MS: _ms("when it left open; 0 while open"),
    },
)

HASH_RECORDS: Final[tuple[HashRecord[Any], ...]] = (
    CALL,
    RUN,
    LANE,
    WATCHDOG,
    BREAKER,
    LOOPS,
    REFUSED,
    OPENCLAW_CALL,
)


# --- keys that are not hashes ----------------------------------------------------------------


class EventField(enum.StrEnum):
    """The one field every entry of the events stream has; the others depend on the kind."""

    KIND = "kind"


_LEDGER_TTL = "ledger.ttl_s"
_RUN_KEYS_TTL = (
    "until ledger.ttl_s + 61 s past its latest call's deadline, rounded up to a minute (the run's"
    " keys_until_ms, run_indexes.RunKeysTtl): set by a registration about once a minute, it outlives"
    " every call record it lists"
)
_DONE_TTL = (
    "ledger.ttl_s + 120 s, set when the run ends (session_end.lua, a loop abort), by the watchdog when"
    " the run record is gone (drop_stale), by a finish on a run not running and by a hand-back:"
    " while the run runs, its waiters empty it on every wake-up"
)
_INDEX_TTL = (
    "ledger.ttl_s + 60 s, reset at most once a minute per process (keys.IndexTtl): an index only has to"
    " outlive its members"
)
_REFRESHED = "ledger.ttl_s, refreshed on every write"
_ON_BEGIN = "ledger.ttl_s, refreshed on begin"
_BREAKER_TTL = "the tool's window_s + cooldown_s, set on every write"

KEY_RECORDS: Final[tuple[KeyRecord, ...]] = (
    KeyRecord("late", "RunKeys.late", "LIST", _LEDGER_TTL,
              "finish script", "audit, CLI",
              "results (ToolResult JSON) that lost the first-writer race"),
    KeyRecord("lease", "RunKeys.lease", "STRING", "lease.ttl_s (PX), renewed",
              "worker child (claim), worker main (renew)", "gateway, watchdog",
              "the claiming worker's id"),
    KeyRecord("calls", "RunKeys.calls", "ZSET", _RUN_KEYS_TTL,
              "register script (finish: calls never registered)", "collect, CLI",
              "member call id, score submitted ms; no call leaves it"),
    KeyRecord("done", "RunKeys.done", "LIST", _DONE_TTL,
              "finish script, a waiter handing a signal back", "gateway (BLPOP)",
              "'<result JSON>\\x1f<call id>' per answered call (ledger.Signal): the waiting gateway's"
              " wake-up with its answer, so it reads no record; a waiter hands another's back behind a NUL"),
    KeyRecord("history", "RunKeys.history", "ZSET",
              "loops.ttl_s, refreshed when its ttl_ms is a tenth of it old", "loop-check script",
              "loop-check script", "member '<seq>|<entry json>', score seq (see loop_history.py)"),
    KeyRecord("due", "index_keys.due", "ZSET", _INDEX_TTL,
              "register (hint), finish, watchdog", "watchdog",
              "member 'S/R/C' (quoted parts), score the deadline ms or the sweep's first look's"),
    KeyRecord("leases", "index_keys.leases", "ZSET", _INDEX_TTL,
              "worker (a late claim, renew XX GT), finish (remove), watchdog (first look adds; re-score"
              " or drop)", "watchdog",
              "member 'S/R/C', score the lease's expiry ms as last written"),
    KeyRecord("events", "events_stream_key", "STREAM", _REFRESHED + "; MAXLEN ~10000",
              "finish (synthetic winners), gateway (loop verdicts), watchdog (alerts)", "unstuck up",
              "entries: kind (EventField.KIND) plus that kind's fields, str or JSON"),
    KeyRecord("fence", "SessionKeys.fence", "STRING", _LEDGER_TTL,
              "sessions (INCR on begin)", "sessions",
              "the session's fencing counter (INCR per run begun)"),
    KeyRecord("by_deadline", "index_keys.by_deadline", "ZSET", _ON_BEGIN,
              "sessions (begin), watchdog (members leave on run end)", "watchdog, CLI",
              "member 'S/R' of a running run, score its deadline ms"),
    KeyRecord("by_progress", "index_keys.by_progress", "ZSET", _ON_BEGIN,
              "sessions (begin, touch), watchdog", "watchdog, CLI",
              "member 'S/R' of a running run, score its latest progress ms (raised only)"),
    KeyRecord("ended", "index_keys.ended", "ZSET", "ledger.ttl_s, refreshed on end",
              "sessions (end; older members trimmed)", "CLI",
              "member 'S/R' of an ended run, score its end ms (older than a TTL: trimmed)"),
    KeyRecord("sweep_lock", "sweep_lock_key", "STRING",
              "PX max(30 s, 3 sweep intervals): a dead sweeper's lock frees itself; one a Redis"
              " outage kept from release is released by its watchdog's next sweep", "watchdog sweep (SET NX)",
              "watchdog sweep", "the token of the sweep holding it"),
    KeyRecord("listener", "listener_poke_key", "LIST", "60 s, refreshed on every poke",
              "async gateway (pokes its own listener)", "the same process's done listener (BLPOP)",
              "pokes ('1') to one async gateway's done listener: each re-issues its BLPOP"),
    KeyRecord("failures", "BreakerKeys.failures", "ZSET", _BREAKER_TTL,
              "gateway (breaker failure script)", "breaker script",
              "member 'S/R/C' of a failed call of the tool, score when it failed (trimmed to the window)"),
    KeyRecord("replica_fence", "replica_fence_key", "STRING", "PX 60 s",
              "gateway, worker, watchdog (before a WAIT on Redis Cluster)", "none",
              "'1': a write on the node owning the run's slot, which the WAIT after it counts on"
              " its replicas (replica_acks.py)"),
    KeyRecord("duplicates", "duplicates_key", "STRING", _REFRESHED,
              "worker (a call claimed again)", "metrics",
              "executions of calls claimed again after an earlier attempt (INCR per claim)"),
    KeyRecord("openclaw_open", "OpenClawKeys.open", "ZSET", "ledger.ttl_s, refreshed on start",
              "HTTP door (start adds, end removes), watchdog (removes)", "watchdog, CLI",
              "member 'S/C' of an open OpenClaw call, score its deadline ms"),
    KeyRecord("openclaw_activity", "OpenClawKeys.activity", "ZSET", "ledger.ttl_s, refreshed on start",
              "HTTP door (every report)", "watchdog (tier-2 scan), CLI",
              "member the OpenClaw session key (quoted), score its latest reported activity ms"),
    KeyRecord("openclaw_streams", "OpenClawKeys.streams", "ZSET", "ledger.ttl_s, refreshed on a model call",
              "HTTP door (model call started adds, ended removes), watchdog (recovered)",
              "watchdog (tier-2 scan), CLI",
              "member 'S/R' of a run whose model call is in flight, score its start ms"),
    KeyRecord("openclaw_tombstones", "OpenClawKeys.tombstones", "SET", "ledger.ttl_s, refreshed on a change",
              "watchdog (a tombstone alerted adds, one no longer reported removes)", "watchdog, metrics",
              "member 'S/I' of a session OpenClaw's restart recovery tombstoned (key, session id),"
              " alerted once"),
    KeyRecord("kept_answers", "kept_answers_key", "STRING", _REFRESHED,
              "gateway, unstuck serve/mcp (answer_restore.lua: a kept answer written back, or a"
              " conflict)", "metrics",
              "answers a failover lost that their deliverer wrote back ('restored') or could not"
              " ('conflict'): INCR each (kept_answers.py)"),
    KeyRecord("queue", "broker_queue_key", "LIST", "none (kombu's; not under P)",
              "register script (a plain Redis broker on the ledger's node), Celery", "tool workers"
              " (Celery BRPOP)", "invoke task messages, in kombu's format"),
)  # fmt: skip


def _cell(text: str) -> str:
    """``text`` in a Markdown table cell: no column break, no HTML tag."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _field_rows(record: HashRecord[Any]) -> list[str]:
    specs = [(str(name), spec) for name, spec in record.fields.items()]
    specs += [(prefix + "…", spec) for prefix, spec in record.families.items()]
    rows = []
    for name, spec in specs:
        default = spec.default
        missing = (
            "required"
            if default is REQUIRED
            else f"'{default}'"
            if isinstance(default, str)
            else str(default)
        )
        rows.append(f"| `{name}` | {spec.kind} | {_cell(spec.meaning)} | {_cell(missing)} |")
    return rows


def schema_table() -> str:
    """Every key as docs/architecture.md shows it, rendered from the declarations above.

    One row per key (its pattern, type, TTL and why, writers, readers, what it holds), then
    the fields of each HASH. ``tests/unit/test_records.py`` holds the page to this rendering.
    """
    declared: list[HashRecord[Any] | KeyRecord] = [*HASH_RECORDS, *KEY_RECORDS]
    by_builder = {record.builder: record for record in declared}
    lines = ["| key | type | TTL | written by | read by | holds |", "| --- | --- | --- | --- | --- | --- |"]
    for builder in KEY_PATTERNS:  # in their order: a run's keys, a session's, the indexes, the rest
        record = by_builder[builder]
        holds = record.holds if isinstance(record, KeyRecord) else f"the {record.name} fields below"
        cells = (record.redis_type, record.ttl, record.writers, record.readers, holds)
        lines.append(f"| `{record.key}` | " + " | ".join(_cell(c) for c in cells) + " |")
    for record in HASH_RECORDS:
        lines += ["", f"**{record.name}** (`{record.key}`)", ""]
        lines += ["| field | type | meaning | when missing |", "| --- | --- | --- | --- |"]
        lines += _field_rows(record)
    return "\n".join(lines) + "\n"


def declared_field(name: str) -> bool:
    """Whether ``name`` is a field (or in a field family) of some HASH record."""
    return any(
        name in record.fields or any(name.startswith(prefix) for prefix in record.families)
        for record in HASH_RECORDS
    )


# --- reading a hash by field name ------------------------------------------------------------

E = TypeVar("E", bound=enum.StrEnum)

_Raw = str | bytes | int | float | None


def _decode(value: _Raw) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class Row(Generic[F]):
    """One hash as read, by field name; each typed read applies the field's declared default."""

    __slots__ = ("_values", "record", "where")

    def __init__(self, record: HashRecord[F], values: Mapping[Any, _Raw], *, where: str = "") -> None:
        self.record = record
        self.where = where or f"a {record.name} record"
        self._values = {
            str(_decode(k)): v for k, value in values.items() if (v := _decode(value)) is not None
        }

    @classmethod
    def zip(
        cls, record: HashRecord[F], names: Sequence[F], reply: Sequence[_Raw], *, where: str = ""
    ) -> Row[F]:
        """The row of an ``HMGET`` of ``names`` (missing fields come back as None)."""
        return cls(record, dict(zip(names, reply, strict=True)), where=where)

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __bool__(self) -> bool:
        return bool(self._values)

    def raw(self, name: F) -> str | None:
        """The stored text of a field, None when missing (no default applied)."""
        return self._values.get(name)

    def text(self, name: F) -> str:
        """A field as text; missing: its declared default."""
        value = self._values.get(name)
        return value if value is not None else self._default(name, str)

    def integer(self, name: F) -> int:
        """A number field; missing or malformed: its declared default."""
        value = self.maybe_integer(name)
        return value if value is not None else self._default(name, int)

    def maybe_integer(self, name: F) -> int | None:
        """A number field, None when missing or malformed (for readers to whom absence is news)."""
        try:
            return int(self._values[name])
        except (KeyError, ValueError):
            return None

    def flag(self, name: F) -> bool:
        """A ``"1"``/``"0"`` field; missing: its declared default."""
        value = self._values.get(name)
        return value == "1" if value is not None else bool(self._default(name, int))

    def member(self, name: F, values: type[E]) -> E:
        """An enum field; missing: its declared default; a value outside ``values`` is a ``StoreError``."""
        value = self._values.get(name)
        try:
            return values(value if value is not None else self._default(name, str))
        except ValueError:
            raise StoreError(f"{self.where}: {name} holds {value!r}, not a {values.__name__}") from None

    def _default(self, name: F, kind: type[int] | type[str]) -> Any:
        default = self.record.fields[name].default
        if default is REQUIRED:
            raise StoreError(f"{self.where}: the {self.record.name} record has no valid {name}")
        if not isinstance(default, kind):
            raise TypeError(f"{self.record.name}.{name} is not read as {kind.__name__}")
        return default


def reply_member(values: type[E], raw: _Raw, *, where: str) -> E:
    """A state a script returned, as its enum; any other value is a ``StoreError``."""
    try:
        return values(_decode(raw) or "")
    except ValueError:
        raise StoreError(f"{where} returned {raw!r}, not a {values.__name__}") from None


# --- the call record as its readers see it ----------------------------------------------------


@dataclass(frozen=True)
class CallRecord:
    """A call as the ledger holds it; ``fields`` as stored, ``row`` to read them by declared name."""

    call_id: str
    tool: str
    state: CallState
    result: ToolResult | None
    fields: dict[str, str]

    @property
    def row(self) -> Row[CallField]:
        """The stored fields with their declared types and defaults."""
        return Row(CALL, self.fields)

    @classmethod
    def of(cls, keys: RunKeys, call_id: str, fields: dict[str, str]) -> CallRecord | None:
        """The record a call's stored hash holds; None when it holds nothing (never written, expired)."""
        if not fields:
            return None
        row = Row(CALL, fields, where=keys.call(call_id))
        stored = row.raw(CallField.RESULT)
        result = ToolResult.from_json(stored) if stored is not None else None
        state = row.member(CallField.STATE, CallState)
        return cls(call_id, row.text(CallField.TOOL), state, result, fields)


# What the gateway and watchdog need of an unanswered call (ledger_open.lua reads these).
OPEN_FIELDS = (
    CallField.CALL_ID, CallField.STATE, CallField.DEADLINE_MS, CallField.ATTEMPT, CallField.IDEMPOTENT,
    CallField.DISPATCHED, CallField.SUBMITTED_MS, CallField.TOOL, CallField.QUEUED_MS,
    CallField.REPUBLISHES,
)  # fmt: skip


def open_call(row: Row[CallField], lease_alive: bool) -> OpenCall:
    """The :class:`OpenCall` an :data:`OPEN_FIELDS` row describes."""
    return OpenCall(
        call_id=row.text(CallField.CALL_ID),
        tool=row.text(CallField.TOOL),
        state=row.member(CallField.STATE, CallState),
        deadline_ms=row.integer(CallField.DEADLINE_MS),
        attempt=row.integer(CallField.ATTEMPT),
        lease_alive=lease_alive,
        idempotent=row.flag(CallField.IDEMPOTENT),
        dispatched=row.flag(CallField.DISPATCHED),
        submitted_ms=row.integer(CallField.SUBMITTED_MS),
        queued_ms=row.maybe_integer(CallField.QUEUED_MS),
        republishes=row.integer(CallField.REPUBLISHES),
    )
