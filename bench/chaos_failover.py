"""The chaos soak's failover legs (``--faults failover`` and ``--faults cluster-failover``).

* ``failover``: a primary, one replica and three Sentinels on loopback
  (tests/sentinel_harness.py); unstuck's processes reach them through the Sentinel list. One
  episode at a time: the primary SIGKILLed (and restarted once the replica is promoted: it
  rejoins as a replica), the primary SIGSTOPped for 2-15 s, the replica SIGKILLed and
  restarted, a Sentinel SIGKILLed and restarted.
* ``cluster-failover``: a Redis Cluster of 3 primaries with a replica each
  (tests/harness.py: LocalCluster); a primary SIGKILLed, its replica promoted, the dead node
  restarted (it rejoins as a replica). Celery's broker is a single redis-server beside it.

The checker keeps its own history outside Redis (:class:`History`): every batch an agent was
handed (``handed.jsonl``, appended by the soak's agents) and every execution a tool began
(``executions.jsonl``, appended by the tool before its side effect: tests/misbehaving_tools.py).
A duplicate execution is a second line for the same call and attempt (a retry is a new
attempt, not a duplicate).

The failover allowance: no answer may come later than its deadline + the gateway's grace +
one allowance, derived from the topology's settings (:func:`sentinel_allowance_ms`,
:func:`cluster_allowance_ms`).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from random import Random

import redis

from tests.harness import LocalCluster, wait_until
from tests.sentinel_harness import DOWN_AFTER_MS, FAILOVER_TIMEOUT_MS, LocalSentinels
from workers import ToolResult
from workers.local.embedded_redis import EmbeddedRedis
from workers.settings import Settings

__all__ = [
    "CLUSTER_NODE_TIMEOUT_MS",
    "Episode",
    "FaultThread",
    "HandedBatch",
    "History",
    "cluster_allowance_ms",
    "cluster_episode",
    "duplicate_executions",
    "episode_times",
    "first_answers_ms",
    "sentinel_allowance_ms",
    "sentinel_episode",
    "sentinel_kinds",
]

CallKey = tuple[str, str, str]  # session, run, call id

#: The cluster leg's ``cluster-node-timeout``: a dead primary is failed after it.
CLUSTER_NODE_TIMEOUT_MS = 2000
# A replica's election after the node timeout: 500 ms + up to 500 ms random + 1 s per rank
# (one replica: rank 0), then the other primaries' votes; 2 s bounds it on loopback.
_CLUSTER_ELECTION_MS = 2000
_SETTLE_S = 60.0  # a topology that has not settled this long after a fault is a failure


def _client_retry_ms(settings: Settings) -> int:
    """One command timing out on a stalled primary, then one backoff of redis-py's default retry."""
    retry = redis.Redis().get_retry()
    cap_s = float(getattr(retry._backoff, "_cap", 1.0)) if retry is not None else 1.0
    return int((settings.redis.socket_timeout_s + cap_s) * 1000)


def sentinel_allowance_ms(settings: Settings) -> int:
    """down-after-milliseconds + failover-timeout (the promotion's bound) + the client's retry."""
    return DOWN_AFTER_MS + FAILOVER_TIMEOUT_MS + _client_retry_ms(settings)


def cluster_allowance_ms(settings: Settings) -> int:
    """cluster-node-timeout + the replica's election + the client's retry."""
    return CLUSTER_NODE_TIMEOUT_MS + _CLUSTER_ELECTION_MS + _client_retry_ms(settings)


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class HandedBatch:
    """One batch as the agent was handed it."""

    session: str
    run: str
    submitted_ms: int
    returned_ms: int
    results: list[ToolResult]


class History:
    """The checker's history outside Redis: two append-only files in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.handed_path = directory / "handed.jsonl"
        self.executions_path = directory / "executions.jsonl"
        self._lock = threading.Lock()

    def handed(self, session: str, run: str, submitted_ms: int, results: list[ToolResult]) -> None:
        """Append what an agent was just handed (before it acts on it)."""
        line = json.dumps(
            {
                "session": session,
                "run": run,
                "submitted_ms": submitted_ms,
                "returned_ms": _now_ms(),
                "results": [r.to_json() for r in results],
            }
        )
        with self._lock, self.handed_path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")

    def batches(self) -> list[HandedBatch]:
        """Every batch handed, in the order appended."""
        if not self.handed_path.exists():
            return []
        found = []
        for line in self.handed_path.read_text(encoding="utf-8").splitlines():
            raw = json.loads(line)
            results = [ToolResult.from_json(r) for r in raw["results"]]
            found.append(
                HandedBatch(raw["session"], raw["run"], raw["submitted_ms"], raw["returned_ms"], results)
            )
        return found

    def executions(self) -> list[dict[str, object]]:
        """Every execution a tool began (one JSON object per line)."""
        if not self.executions_path.exists():
            return []
        lines = self.executions_path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]


def duplicate_executions(executions: list[dict[str, object]]) -> tuple[int, int, list[str]]:
    """Duplicate executions, re-runs of idempotent tools, and a few examples of duplicates.

    One execution is one context a worker built for the call (``execution``): the tool's own
    retries inside it are not counted. An idempotent tool run again under a new attempt number
    (a lost worker's call, re-run by design) is a re-run; any other execution of a call beyond
    its first (a claim lost to a failover and run again, a non-idempotent tool re-run) is a
    duplicate.
    """
    runs: dict[CallKey, dict[str, tuple[str, bool]]] = {}
    for e in executions:
        key = (str(e["session"]), str(e["run"]), str(e["call"]))
        runs.setdefault(key, {}).setdefault(
            str(e["execution"]), (str(e["attempt"]), bool(e.get("idempotent")))
        )
    duplicates, reruns, examples = 0, 0, []
    for key, by_id in runs.items():
        if len(by_id) < 2:
            continue
        attempts = [attempt for attempt, _ in by_id.values()]
        idempotent = all(flag for _, flag in by_id.values())
        extra = len(by_id) - 1
        rerun = extra if idempotent and len(set(attempts)) == len(attempts) else 0
        reruns += rerun
        if extra > rerun:
            duplicates += extra
            examples.append(
                f"{'/'.join(key)} ({_tool_of(executions, key)}) ran {len(by_id)} times, "
                f"attempts {sorted(attempts)}"
            )
    return duplicates, reruns, examples


def _tool_of(executions: list[dict[str, object]], key: CallKey) -> str:
    """The tool of a call, from its executions."""
    return next(str(e["tool"]) for e in executions if (e["session"], e["run"], e["call"]) == key)


@dataclass
class Episode:
    """One failover fault and what the topology did."""

    kind: str
    began_ms: int
    ended_ms: int = 0
    failover: bool = False  # the primary moved
    promoted_ms: int | None = None  # when a new primary answered, ms after ``began_ms``
    detail: str = ""

    @property
    def hits_primary(self) -> bool:
        return self.kind.startswith("primary")

    @property
    def stalls_writes(self) -> bool:
        """Whether deciding writes may wait through it: a primary's fault, or its replica's death.

        A replica gone costs each process's next deciding write one WAIT timeout
        (``redis.replica_ack_timeout_ms``) before it reads ``INFO`` and writes as a lone Redis.
        """
        return self.hits_primary or self.kind.startswith("replica")


def first_answers_ms(episodes: list[Episode], batches: list[HandedBatch]) -> list[int | None]:
    """For each primary fault: ms from the fault to the first real result of a call sent after it."""
    real = [(b.submitted_ms, b.returned_ms) for b in batches if any(r.reason is None for r in b.results)]
    found: list[int | None] = []
    for episode in (e for e in episodes if e.hits_primary):
        later = [returned for submitted, returned in real if submitted >= episode.began_ms]
        found.append(min(later) - episode.began_ms if later else None)
    return found


def episode_times(duration_s: float) -> list[float]:
    """When episodes start: the first early, then one every 25 s (18 s in a short run)."""
    every = max(18.0, min(25.0, duration_s / 10))
    times, t = [], max(6.0, duration_s * 0.12)
    while t < duration_s * 0.9:
        times.append(t)
        t += every
    return times


#: "primary SIGKILL, then SIGSTOP": the primary killed, restarted, and the promoted one stopped
#: before the old one has resynced from it (a returning primary failed over again: issue 42).
_TWICE = "primary SIGKILL, then SIGSTOP"
_SENTINEL_KINDS = ["primary SIGKILL", "primary SIGSTOP", _TWICE, "replica SIGKILL", "sentinel SIGKILL"]


def sentinel_kinds(count: int, rng: Random) -> list[str]:
    """The measurement's order first (kill, stop, both in a row), then every kind, then at random."""
    rest = _SENTINEL_KINDS[3:]
    rng.shuffle(rest)
    kinds = [*_SENTINEL_KINDS[:3], *rest]
    while len(kinds) < count:
        kinds.append(rng.choice(_SENTINEL_KINDS))
    return kinds[:count]


def _alive(process_of: EmbeddedRedis) -> int:
    process = process_of.process
    assert process is not None, "node not running"
    return process.pid


def _restart(node: EmbeddedRedis) -> None:
    node.stop()  # reaps the killed process
    node.start(timeout_s=30)


def _await_moved(topology: LocalSentinels, old: EmbeddedRedis, until_s: float) -> int | None:
    """Poll until another node answers as the named primary; ms after now, or None by ``until_s``."""
    started = time.monotonic()
    while time.monotonic() - started < until_s:
        named = topology.current_primary()
        if named is not None and named is not old and topology.settled_primary(named):
            return int((time.monotonic() - started) * 1000)
        time.sleep(0.05)
    return None


def sentinel_episode(topology: LocalSentinels, kind: str, rng: Random) -> Episode:
    """Inject one fault into the Sentinel topology and wait until it has settled again."""
    primary = topology.current_primary()
    assert primary is not None, "no primary named by the Sentinels before the fault"
    episode = Episode(kind, _now_ms())
    if kind == "primary SIGKILL":
        os.kill(_alive(primary), signal.SIGKILL)
        moved = _await_moved(topology, primary, 30.0)
        assert moved is not None, "no replica promoted within 30 s of the primary's SIGKILL"
        episode.failover, episode.promoted_ms = True, moved
        time.sleep(rng.uniform(2.0, 6.0))  # the dead primary stays dead a while
        _restart(primary)
        episode.detail = f"old primary {primary.port} restarted"
    elif kind == _TWICE:
        _failed_over_twice(topology, primary, episode, rng)
    elif kind == "primary SIGSTOP":
        stopped_s = rng.uniform(2.0, 15.0)
        os.kill(_alive(primary), signal.SIGSTOP)
        try:
            episode.promoted_ms = _await_moved(topology, primary, stopped_s)
            # Stopped for the whole draw, promoted or not: it resumes still a primary, and the
            # Sentinels demote it only seconds later.
            time.sleep(max(0.0, episode.began_ms / 1000 + stopped_s - time.time()))
        finally:
            os.kill(_alive(primary), signal.SIGCONT)
        episode.failover = episode.promoted_ms is not None
        episode.detail = f"stopped {stopped_s:.1f} s"
    elif kind == "replica SIGKILL":
        replica = topology.other(primary)
        os.kill(_alive(replica), signal.SIGKILL)
        time.sleep(rng.uniform(1.0, 5.0))
        _restart(replica)
    else:
        sentinel = rng.choice(topology.sentinels)
        sentinel.kill()
        time.sleep(rng.uniform(2.0, 6.0))
        sentinel.start()
        wait_until(topology.sentinels_agree, timeout_s=_SETTLE_S, interval_s=0.1, what="sentinels agree")
    wait_until(topology.settled, timeout_s=_SETTLE_S, interval_s=0.1, what=f"topology settled after {kind}")
    if not episode.failover:
        episode.failover = topology.current_primary() is not primary
    episode.ended_ms = _now_ms()
    return episode


def _failed_over_twice(
    topology: LocalSentinels, primary: EmbeddedRedis, episode: Episode, rng: Random
) -> None:
    """Kill the primary, restart it, and stop the promoted one before the old one has resynced.

    The Sentinels wait 8-10 s before they turn the returning node into a replica; the stop
    comes 2-8 s after the restart, so the returning node, promoted again, may lack everything
    the promoted one took. Whoever handed those answers on writes them back (docs/failover.md).
    """
    os.kill(_alive(primary), signal.SIGKILL)
    moved = _await_moved(topology, primary, 30.0)
    assert moved is not None, "no replica promoted within 30 s of the primary's SIGKILL"
    episode.failover, episode.promoted_ms = True, moved
    time.sleep(rng.uniform(2.0, 6.0))
    _restart(primary)
    time.sleep(rng.uniform(2.0, 8.0))
    promoted = topology.current_primary()
    assert promoted is not None, "the Sentinels name no primary after the restart"
    stopped_s = rng.uniform(4.0, 8.0)
    os.kill(_alive(promoted), signal.SIGSTOP)
    try:
        time.sleep(stopped_s)
    finally:
        os.kill(_alive(promoted), signal.SIGCONT)
    again = (
        "the old primary promoted again" if topology.current_primary() is primary else "no second failover"
    )
    episode.detail = (
        f"old primary {primary.port} restarted, promoted {promoted.port} stopped {stopped_s:.1f} s: {again}"
    )


def cluster_episode(cluster: LocalCluster, rng: Random, kind: str = "primary SIGKILL") -> Episode:
    """SIGKILL (or SIGSTOP) a random primary, await its replica's promotion, restart (resume) it.

    A stopped primary may take writes for a moment after its replica is promoted, until it
    learns it was failed over. Never the node ``redis.url`` names: a cluster client finds the
    others from that one node, so a process started while it is down cannot connect at all
    (not fixed here: see docs/failover.md).
    """
    roles = cluster.roles()
    primaries = [n for n in cluster.nodes if roles[n.port] == "master" and n.port != cluster.nodes[0].port]
    victim = rng.choice(primaries)
    episode = Episode(kind, _now_ms())
    stopped = kind == "primary SIGSTOP"
    os.kill(_alive(victim), signal.SIGSTOP if stopped else signal.SIGKILL)
    survivors = [n for n in cluster.nodes if n is not victim]
    started = time.monotonic()

    def promoted() -> bool:
        masters = [p for p, role in cluster.roles().items() if role == "master"]
        return len(masters) == cluster.masters and LocalCluster.healthy(survivors)

    try:
        wait_until(promoted, timeout_s=30, interval_s=0.05, what="the failed primary's replica promoted")
        episode.failover, episode.promoted_ms = True, int((time.monotonic() - started) * 1000)
        time.sleep(rng.uniform(2.0, 5.0))
    finally:
        if stopped:
            os.kill(_alive(victim), signal.SIGCONT)
    if not stopped:
        _restart(victim)
    wait_until(
        lambda: cluster.replicas_linked() and LocalCluster.healthy(cluster.nodes),
        timeout_s=_SETTLE_S,
        interval_s=0.1,
        what="the restarted node rejoined as a replica",
    )
    episode.detail = f"node {victim.port} {'resumed' if stopped else 'restarted'}"
    episode.ended_ms = _now_ms()
    return episode


@dataclass
class FaultThread:
    """Runs the episodes one after another at their times (seconds after ``start``)."""

    plan: list[tuple[float, Callable[[], Episode]]]
    on_episode: Callable[[Episode], None]
    on_error: Callable[[str], None]
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> FaultThread:
        self._thread = threading.Thread(target=self._run, name="failover-faults", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        for at_s, inject in self.plan:
            if self._stop.wait(max(0.0, at_s - (time.monotonic() - started))):
                return
            try:
                self.on_episode(inject())
            except Exception as exc:  # noqa: BLE001 - a topology that will not settle is a failure to report
                self.on_error(f"failover episode: {type(exc).__name__}: {exc}")
                return

    def stop(self, timeout_s: float) -> None:
        """Start no more episodes; wait for the running one to settle."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
