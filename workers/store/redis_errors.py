"""The one translation of a redis-py error into our exceptions, refusals named by cause.

Redis refuses commands for reasons of its own state (a demoted primary, maxmemory reached, too
few replicas, a load in progress, a cluster without all its slots). Each refusal becomes its
:class:`~workers.errors.RedisRefused` subclass, whose message names the cause and the fix and
whose ``retryable`` says whether waiting may help; it is logged here, at most once per cause
every few seconds per process, so an operator sees it without a log line per call. Any
other redis-py error is a plain ``StoreError``.
"""

from __future__ import annotations

import logging
import re
import time

import redis

from workers.errors import (
    ClusterDown,
    NoReplicas,
    PrimaryDown,
    ReadOnlyRedis,
    RedisLoading,
    RedisOutOfMemory,
    RedisRefused,
    StoreError,
)

__all__ = ["refusal_of", "store_error_of"]

log = logging.getLogger(__name__)

_BY_CODE: dict[str, type[RedisRefused]] = {
    "NOREPLICAS": NoReplicas,
    "READONLY": ReadOnlyRedis,
    "OOM": RedisOutOfMemory,
    "LOADING": RedisLoading,
    "CLUSTERDOWN": ClusterDown,
    "MASTERDOWN": PrimaryDown,
}
# The code starts the reply, or follows a script's prefix ("... script: ...: -READONLY ...").
_CODE = re.compile(r"(?:^|[\s:-])(NOREPLICAS|READONLY|OOM|LOADING|CLUSTERDOWN|MASTERDOWN)\b")
# redis-py strips the code of the replies it has a class for; put it back before matching.
_CLASS_CODES: tuple[tuple[type[Exception], str], ...] = (
    (redis.exceptions.ReadOnlyError, "READONLY"),
    (redis.exceptions.OutOfMemoryError, "OOM"),
    (redis.exceptions.BusyLoadingError, "LOADING"),
    (redis.exceptions.MasterDownError, "MASTERDOWN"),  # a subclass of ClusterDownError
    (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
)
_LOG_EVERY_S = 5.0
_last_logged: dict[str, float] = {}


def refusal_of(exc: BaseException) -> RedisRefused | None:
    """The refusal ``exc`` carries (its reply's error code), or None for any other error."""
    reply = str(exc)
    for cls, code in _CLASS_CODES:
        if isinstance(exc, cls) and not _CODE.match(reply):
            reply = f"{code} {reply}"
    found = _CODE.search(reply)
    return _BY_CODE[found.group(1)](reply) if found else None


def store_error_of(exc: Exception) -> StoreError:
    """``exc`` as the StoreError to raise: its refusal class (logged), else a plain one."""
    refused = refusal_of(exc)
    if refused is None:
        return StoreError(f"redis: {type(exc).__name__}: {exc}")
    now = time.monotonic()
    if now - _last_logged.get(refused.cause, -_LOG_EVERY_S) >= _LOG_EVERY_S:
        _last_logged[refused.cause] = now
        log.error("%s (redis replied: %s)", refused, refused.reply)
    return refused
