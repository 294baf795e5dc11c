"""Machinery of the sweep parity tests: identical copies of generated cases, swept and dumped.

Each generated case lives in its own session ``s<n>`` (run ``r``, call ``c1``). A template
prefix is written once; :func:`copy_prefix` copies it key by key (DUMP/RESTORE, same expiry)
to one prefix per sweep path, so both paths start from the same bytes. :func:`dump` reads
everything a sweep left under a prefix and files it by case: the case's own keys, its members
of the global indexes and its entries of the events stream.

The clock is the real one, frozen at import: lanes and leases expire at absolute times.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import redis

from workers.core.models import TextBlock, ToolResult
from workers.settings import Settings
from workers.store.connection import connect
from workers.store.keys import all_index_keys
from workers.store.ledger import Ledger
from workers.store.sessions import SessionStore
from workers.store.sweep_scripts import RunSweep, SweepScripts
from workers.watchdog.alerts import AlertSink

NOW = int(time.time()) * 1000
STALL_MS = 120_000
LEASE_MS = 3_000
FAR_MS = NOW + 3_600_000
ALIVE_MS = 600_000  # a live lease outlives the test
RUN, CALL = "r", "c1"
PATHS = ("scripts", "pipelined", "mutant")  # the mutant: a script with one boundary moved

CASE_TAG = re.compile(r"\{s(\d+)[/}]")
CASE_MEMBER = re.compile(r"^s(\d+)/")


def product(**dims: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """Every combination of the values of ``dims``, as keyword dicts."""
    for values in itertools.product(*dims.values()):
        yield dict(zip(dims, values, strict=True))


def ok_result(call_id: str) -> ToolResult:
    """A tool's own (not synthetic) result."""
    return ToolResult(tool_call_id=call_id, tool_name="echo", content=(TextBlock(text="ok"),), is_error=False)


def sweep_settings(recover: bool = False) -> Settings:
    """The settings every sweep of these tests runs with."""
    lease = {"ttl_s": LEASE_MS / 1000, "renew_interval_s": LEASE_MS / 4000}
    return Settings(watchdog={"stalled_after_s": STALL_MS / 1000, "auto_recover": recover}, lease=lease)


def session_store(client: redis.Redis, prefix: str) -> SessionStore:
    """A store under ``prefix``."""
    return SessionStore(Ledger(client, prefix=prefix, ttl_s=3600, lease_ttl_ms=LEASE_MS))


@contextmanager
def clients(url: str) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    """A decoding client and a raw one (for DUMP) on a flushed private server, quiet watchdog logs.

    The watchdog logs one warning per run it ends; capturing thousands of them costs seconds.
    """
    client = connect(url, socket_timeout_s=10, socket_connect_timeout_s=2)
    raw = redis.Redis.from_url(url)
    client.flushall()
    logger = logging.getLogger("workers.watchdog")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield client, raw
    finally:
        logger.setLevel(level)
        client.close()
        raw.close()


def copy_prefix(raw: redis.Redis, source: str, target: str) -> None:
    """Copy every key of ``source`` to ``target`` (same names, same expiry): identical inputs."""
    keys = list(raw.scan_iter(match=f"{source}:*", count=1000))
    pipe = raw.pipeline(transaction=False)
    for key in keys:
        pipe.dump(key)
        pipe.pttl(key)
    rows = pipe.execute()
    pipe = raw.pipeline(transaction=False)
    for n, key in enumerate(keys):
        if rows[2 * n] is None:  # expired since the scan (a lease an answer left to run out)
            continue
        name = target.encode() + key[len(source) :]
        pipe.restore(name, max(0, rows[2 * n + 1]), rows[2 * n], replace=True)
    pipe.execute()


def lease_score(score: float) -> int | str:
    """A lease index score; one re-scored from a live lease's PTTL only by its kind (that ticks)."""
    return "now + a live lease's ttl" if score > NOW + 10 * LEASE_MS else int(score)


def _read(pipe: Any, key: str, kind: str) -> None:
    if kind == "hash":
        pipe.hgetall(key)
    elif kind == "zset":
        pipe.zrange(key, 0, -1, withscores=True)
    elif kind == "list":
        pipe.lrange(key, 0, -1)
    elif kind == "stream":
        pipe.xrange(key)
    else:
        pipe.get(key)


def _lease_indexes(prefix: str) -> set[str]:
    return {keys.leases for keys in all_index_keys(prefix)}


def _values(client: redis.Redis, prefix: str) -> list[tuple[str, str, Any, bool]]:
    """(name without the prefix, type, value, whether it expires) of every key under ``prefix``."""
    # Lease keys are left out: no sweep writes one, and an answer leaves its lease to run out
    # on the clock, so whether it is still there says when the copy was read, not what a path did.
    keys = sorted(k for k in client.scan_iter(match=f"{prefix}:*", count=1000) if ":lease:" not in k)
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    kinds = pipe.execute()
    pipe = client.pipeline(transaction=False)
    for key, kind in zip(keys, kinds, strict=True):
        _read(pipe, key, kind)
        pipe.pttl(key)
    rows = pipe.execute()
    out = []
    for n, (key, kind) in enumerate(zip(keys, kinds, strict=True)):
        value = rows[2 * n]
        if kind == "zset":
            score = lease_score if key in _lease_indexes(prefix) else int
            value = [(str(member), score(at)) for member, at in value]
        elif kind == "stream":
            value = [entry for _, entry in value]  # entry ids carry the wall clock
        out.append((key[len(prefix) :], kind, value, rows[2 * n + 1] != -1))
    return out


def dump(client: redis.Redis, prefix: str) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """Every key under ``prefix``: by case (own keys, index members, events), and the rest."""
    owned: dict[int, dict[str, Any]] = defaultdict(dict)
    shared: dict[str, Any] = {}
    for name, kind, value, expires in _values(client, prefix):
        if found := CASE_TAG.search(name):
            owned[int(found[1])][name] = (value, expires)
            continue
        if kind not in ("zset", "stream"):
            shared[name] = (value, expires)
            continue
        shared[name] = expires
        for item in value:
            session = item[0] if kind == "zset" else item.get("session", "") + "/"
            if found := CASE_MEMBER.match(session):
                owned[int(found[1])].setdefault(name, []).append(item)
            else:
                shared.setdefault(f"{name} (no case)", []).append(item)
    return owned, shared


class RecordingSink(AlertSink):
    """Keeps alerts by session instead of sending them."""

    def __init__(self) -> None:
        super().__init__()
        self.by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def emit(self, event: dict[str, Any]) -> None:
        self.by_session[str(event["session_key"])].append(event)


class RecordingScripts(SweepScripts):
    """The real scripts (or a mutant of one), remembering which runs the run script hands back."""

    def __init__(self, ledger: Ledger, *, runs_lua: str = "") -> None:
        super().__init__(ledger)
        self.handed_back: list[tuple[str, str]] = []
        if runs_lua:
            self._runs = ledger.client.register_script(runs_lua)

    def runs(self, *, now_ms: int, stalled_after_ms: int, auto_recover: bool, limit: int) -> RunSweep:
        found = super().runs(
            now_ms=now_ms, stalled_after_ms=stalled_after_ms, auto_recover=auto_recover, limit=limit
        )
        self.handed_back.extend(found.rest)
        return found


def mutant(name: str, line: str, into: str) -> str:
    """The script ``name`` with one line changed (the line must exist: the twin stays honest)."""
    text = resources.files("workers.store").joinpath("scripts", name).read_text(encoding="utf-8")
    assert text.count(line) == 1, f"{name} no longer has {line!r}"
    return text.replace(line, into)


@dataclass
class Swept:
    """What one sweep path left behind, by case number."""

    outcomes: dict[int, Any] = field(default_factory=dict)
    states: dict[int, dict[str, Any]] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    handed_back: set[int] = field(default_factory=set)
