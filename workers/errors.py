"""The one exception hierarchy of unstuck.

Every error raised on purpose by unstuck derives from :class:`UnstuckError`. Retry
decisions read the typed ``retryable`` field, never the message text::

    UnstuckError
     ├── ConfigError                 invalid settings or config file (names the key path)
     ├── ToolCallError               one tool call went wrong
     │    ├── ToolNotFound           no tool of that name is registered
     │    ├── InvalidArguments       arguments failed the tool's schema
     │    ├── ToolExecutionError     the tool raised; ``retryable`` says if a retry may help
     │    └── CallFailed             a call's one result is not a tool's success (its task's FAILURE)
     │         └── one class per SyntheticReason, generated (workers.core.outcome.CALL_FAILURES):
     │             TimeoutSoft (timeout_soft), WorkerLost (worker_lost), ...; ToolFailed for
     │             tool_error and ArgumentsInvalid for invalid_arguments (the names Flower shows)
     ├── LoopDetected                the loop detector blocked a call or aborted a run
     │    └── CompactionLoopPersisted  a loop survived context compaction: the run is aborted
     ├── TranscriptError
     │    ├── TranscriptRepairError  a transcript cannot be read or repaired
     │    └── ProviderFormatError    an unknown format, or a provider message not in its shape
     ├── StoreError                  Redis unreachable or returned something unexpected
     │    ├── RedisRefused           Redis answered but refused the command (``cause``, ``fix``)
     │    │    └── NoReplicas, ReadOnlyRedis, RedisOutOfMemory, RedisLoading, ClusterDown,
     │    │        PrimaryDown (each with its own ``retryable``)
     │    └── ReplicasBehind         a deciding write that too few replicas acknowledged in time
     ├── WorkerConfigError           a worker was started in a way that cannot keep the promise
     └── StreamIdleTimeout           a model stream sent nothing for too long

A tool is stopped by billiard's ``SoftTimeLimitExceeded``, raised in its pool child at the soft
limit, on a stale heartbeat and on a cancel; the worker catches it before any broad ``except``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CallFailed",
    "ClusterDown",
    "CompactionLoopPersisted",
    "ConfigError",
    "InvalidArguments",
    "LoopDetected",
    "NoReplicas",
    "PrimaryDown",
    "ProviderFormatError",
    "ReadOnlyRedis",
    "RedisLoading",
    "RedisOutOfMemory",
    "RedisRefused",
    "ReplicasBehind",
    "StoreError",
    "StreamIdleTimeout",
    "ToolCallError",
    "ToolCrashed",
    "ToolExecutionError",
    "ToolNotFound",
    "TranscriptError",
    "TranscriptRepairError",
    "UnstuckError",
    "WorkerConfigError",
]


class UnstuckError(Exception):
    """Base of every error unstuck raises on purpose."""

    retryable: bool = False


class ConfigError(UnstuckError):
    """Raised when settings or the config file are invalid; the message names each key path."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        lines = [f"{path or '<root>'}: {reason}" for path, reason in problems]
        super().__init__("invalid configuration:\n  " + "\n  ".join(lines))


class ToolCallError(UnstuckError):
    """Base for errors of one tool call."""


class ToolNotFound(ToolCallError):
    """Raised when a call names a tool that is not registered."""

    def __init__(self, name: str, closest: list[str]) -> None:
        self.name = name
        self.closest = closest
        super().__init__(f"unknown tool {name!r}")


class InvalidArguments(ToolCallError):
    """Raised when a call's arguments fail the tool's schema; ``problems`` lists each one."""

    def __init__(self, tool: str, problems: list[str]) -> None:
        self.tool = tool
        self.problems = problems
        super().__init__(f"invalid arguments for {tool!r}: " + "; ".join(problems))


class ToolExecutionError(ToolCallError):
    """Raised by a tool (or on its behalf) when it fails; ``retryable`` drives the retry policy."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        self.retryable = retryable
        super().__init__(message)


class ToolCrashed(ToolExecutionError):
    """Raised on a tool's behalf when the process serving it ended during the call: ``crashed``."""


class CallFailed(ToolCallError):
    """A call whose one result is not a tool's success: its invoke task ends FAILURE with this.

    The subclass names the reason, the message the reason and what the model was told (never
    a traceback); ``info`` is the call's outcome summary. There is one subclass per
    ``SyntheticReason``, generated where results become task outcomes
    (``workers.core.outcome.CALL_FAILURES``): the reason enum is the one list of them.
    """

    reason = ""

    def __init__(self, message: str, info: dict[str, Any] | None = None) -> None:
        self.info = info or {}
        super().__init__(message)


class LoopDetected(UnstuckError):
    """Raised when the loop detector blocks a call or aborts a run."""

    def __init__(self, detector: str, count: int, message: str) -> None:
        self.detector = detector
        self.count = count
        self.results: list[Any] = []  # one result per submitted call, set by the gateway
        super().__init__(message)


class CompactionLoopPersisted(LoopDetected):
    """Raised by the gateway when a loop survived context compaction and the run was aborted."""


class TranscriptError(UnstuckError):
    """Base for transcript problems."""


class TranscriptRepairError(TranscriptError):
    """Raised when a transcript cannot be parsed or repaired; ``path`` is a JSON path."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class ProviderFormatError(TranscriptError):
    """Raised when a format name is unknown or a provider message is not in the format's shape.

    ``path`` is the JSON path of the problem in the message (``$`` is the message itself), or
    None for an unknown format; ``formats`` lists the valid format names.
    """

    def __init__(self, path: str | None, reason: str, formats: tuple[str, ...] = ()) -> None:
        self.path = path
        self.reason = reason
        self.formats = formats
        super().__init__(reason if path is None else f"{path}: {reason}")


class StoreError(UnstuckError):
    """Raised when Redis is unreachable or answers unexpectedly."""

    retryable = True


class ReplicasBehind(StoreError):
    """A deciding write (a registration, claim or result) too few replicas acknowledged in time.

    ``redis.min_replica_acks`` replicas did not confirm it within ``redis.replica_ack_retry_s``
    (every ``WAIT`` came back short, or no primary answered): the write is not treated as
    decided, because a failover now could discard it. Retryable: a replica catching up, or a
    failover finishing, lets the same write through.
    """

    retryable = True


class RedisRefused(StoreError):
    """Redis refused a command for a reason of its own state: the error names it and the fix.

    ``cause`` is Redis's error code (``READONLY``, ``OOM``, ...); ``retryable`` says whether the
    same command may succeed later without an operator (a failover finishing, a load ending).
    """

    cause = ""
    fix = ""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        super().__init__(f"redis refused the command ({self.cause}): {self.explanation}; fix: {self.fix}")

    explanation = ""


class NoReplicas(RedisRefused):
    """``NOREPLICAS``: the primary has fewer good replicas than its ``min-replicas-to-write``."""

    cause = "NOREPLICAS"
    explanation = "the primary has fewer replicas in sync than its min-replicas-to-write"
    fix = "bring a replica back (or lower min-replicas-to-write / raise min-replicas-max-lag)"


class ReadOnlyRedis(RedisRefused):
    """``READONLY``: the server is a replica (a demoted primary, or a URL naming a replica)."""

    cause = "READONLY"
    explanation = "this server is a read-only replica, not the primary"
    fix = "point redis.url at the primary, or at the Sentinels (sentinel://...) so clients follow it"


class RedisOutOfMemory(RedisRefused):
    """``OOM``: maxmemory reached with ``noeviction``; nothing succeeds until memory frees."""

    cause = "OOM"
    retryable = False
    explanation = "used memory is over maxmemory (policy noeviction)"
    fix = "raise maxmemory or shorten ledger.ttl_s; never switch to an evicting policy"


class RedisLoading(RedisRefused):
    """``LOADING``: the server is loading its dataset after a restart."""

    cause = "LOADING"
    explanation = "the server is still loading its dataset into memory"
    fix = "wait for the load to end; it is answered once it does"


class ClusterDown(RedisRefused):
    """``CLUSTERDOWN``: a Redis Cluster with slots not served (a primary lost, no failover yet)."""

    cause = "CLUSTERDOWN"
    explanation = "the cluster cannot serve every slot"
    fix = "restore or fail over the cluster's missing primary (give every primary a replica)"


class PrimaryDown(RedisRefused):
    """``MASTERDOWN``: a replica lost its primary and is set not to serve stale data."""

    cause = "MASTERDOWN"
    explanation = "the replica reached has lost its link to the primary"
    fix = "wait for the failover, and point redis.url at the Sentinels or the primary"


class WorkerConfigError(UnstuckError):
    """Raised when a worker is started with a pool or setting that cannot enforce limits."""


class StreamIdleTimeout(UnstuckError):
    """Raised when a model stream yields nothing within its idle timeout."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        super().__init__(f"model stream sent nothing for {idle_s:.1f}s")
