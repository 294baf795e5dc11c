"""The worker main process's watch over its running calls, one tick every renew interval.

Each tick renews the leases of calls whose pool child is alive (and counts each such call's
claim in its run's summary, once: a claim does not count itself, see
:class:`workers.store.claims.ClaimCounter`), answers the calls whose child died, stops tools
whose heartbeat went stale, and enforces cancels. The main process
survives a hung or killed pool child, so these answers still come. The Celery bootstep that
runs the ticks on a thread is :class:`workers.celery_edge.bootsteps.LeaseKeeping`; the pool
children tell it which calls they run (:mod:`workers.worker.child_slots`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from typing import Any

from workers.core.heartbeats import ChildVerdict, RunningCall, judge_running_call
from workers.core.models import SyntheticReason
from workers.runtime import now_ms, runtime, worker_id
from workers.store.claims import ClaimCounter
from workers.store.keys import RunKeys
from workers.worker.cancel import CancelEnforcer, RunningJob
from workers.worker.lost_calls import answer_from_main_process, answer_lost_child, pid_alive, pid_of
from workers.worker.memory_guard import memory_guard

__all__ = ["LeaseKeeper", "renew_interval_s"]

_KILLED = "; it did not stop within limits.cancel_grace_s and was killed"


def renew_interval_s() -> float:
    """How often the keeper ticks: the lease renew interval, at most half a second."""
    return min(runtime().settings.lease.renew_interval_s, 0.5)


def _job_keys(kwargs: Any, prefix: str) -> tuple[RunKeys, str, float | None] | None:
    job = kwargs.get("job") if isinstance(kwargs, dict) else None
    if not isinstance(job, dict) or not isinstance(job.get("call"), dict):
        return None
    keys = RunKeys(prefix, str(job.get("session_key")), str(job.get("run_id")))
    beat = job.get("heartbeat_s")
    return keys, str(job["call"].get("id")), float(beat) if beat else None


class LeaseKeeper:
    """Renews leases of running calls, answers calls whose pool child died, stops silent tools."""

    def __init__(self) -> None:
        self._cancels: CancelEnforcer | None = None
        self._counter: ClaimCounter | None = None
        self._counted: set[str] = set()  # call keys whose claim this keeper counted

    def tick(self, running: list[dict[str, Any]]) -> None:
        """One pass over the keyword arguments of the invoke tasks this worker holds."""
        rt = runtime()
        jobs = [(kwargs, found) for kwargs in running if (found := _job_keys(kwargs, rt.ledger.prefix))]
        rows = rt.ledger.running_states([(keys, call_id) for _, (keys, call_id, _) in jobs])
        renew: list[tuple[RunKeys, str]] = []
        host, now = socket.gethostname(), now_ms()
        for (kwargs, (keys, call_id, beat_s)), (state, worker, last_beat) in zip(jobs, rows, strict=True):
            call = RunningCall(state, worker, last_beat, beat_s)
            verdict = judge_running_call(call, host=host, child_alive=pid_alive(worker), now_ms=now)
            if verdict is ChildVerdict.RENEW:
                renew.append((keys, call_id))
            elif verdict is ChildVerdict.CHILD_DIED:
                answer_lost_child(kwargs, pid_of(worker), detail=f"pool process {worker} died")
            elif verdict is ChildVerdict.HEARTBEAT_STALE:
                self._interrupt(kwargs, worker)
        rt.ledger.renew_leases(renew, worker_id(), now_ms=now)
        self._count_claims(renew, now)
        memory_guard().sweep(lambda pid: pid_alive(f"{host}:{pid}"))
        self._enforce_cancels(
            [
                RunningJob(kwargs, keys, call_id, worker)
                for (kwargs, (keys, call_id, _)), (_, worker, _) in zip(jobs, rows, strict=True)
                if worker.startswith(f"{host}:")  # never signal a pid of another host's worker
            ],
            now,
        )

    def _count_claims(self, renew: list[tuple[RunKeys, str]], now: int) -> None:
        """Count the claims of running calls not counted yet; forget calls no longer running here."""
        running = {keys.call(call_id): (keys, call_id) for keys, call_id in renew}
        self._counted &= running.keys()
        for key, (keys, call_id) in running.items():
            if key not in self._counted:
                if self._counter is None:
                    self._counter = ClaimCounter(runtime().ledger.client)
                self._counter.count(keys, call_id, now_ms=now)
                self._counted.add(key)

    def _enforce_cancels(self, jobs: list[RunningJob], now: int) -> None:
        if self._cancels is None:
            rt = runtime()
            self._cancels = CancelEnforcer(
                rt.ledger,
                grace_s=rt.settings.limits.cancel_grace_s,
                slack_s=renew_interval_s() + 0.5,  # a cooperative tool's own grace ends first
                answer=lambda job: answer_from_main_process(
                    job.kwargs, SyntheticReason.CANCELLED, detail=_KILLED
                ),
                interrupt=lambda job: self._signal_child(job.worker),
            )
        self._cancels.tick(jobs, now_ms=now)

    def _interrupt(self, kwargs: dict[str, Any], worker: str) -> None:
        answer_from_main_process(kwargs, SyntheticReason.HEARTBEAT_TIMEOUT)
        self._signal_child(worker)

    @staticmethod
    def _signal_child(worker: str) -> None:
        # SIGUSR1 is how the prefork pool delivers the soft limit: the tool unwinds and its
        # process groups are killed; the hard limit still applies if it ignores that.
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(worker.rsplit(":", 1)[-1]), signal.SIGUSR1)
