"""Worker bootsteps: refuse pools that cannot enforce limits; keep leases; enforce heartbeats.

Both run in the worker's main process, which survives a hung or killed pool child.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from typing import Any

from celery import Celery, bootsteps, signals
from celery.worker import state

from tasks.requests import answer_from_main_process, answer_lost_child, pid_alive, pid_of
from workers.core.heartbeats import ChildVerdict, RunningCall, judge_running_call
from workers.core.models import SyntheticReason
from workers.errors import ConfigError, StoreError, WorkerConfigError
from workers.redact import install_log_redaction
from workers.runtime import now_ms, runtime, worker_id
from workers.store.keys import RunKeys
from workers.task_names import INVOKE_TASK
from workers.worker.cancel_enforcer import CancelEnforcer, RunningJob
from workers.worker.memory_guard import install_memory_guard, memory_guard

__all__ = ["LeaseKeeper", "PoolGuard", "check_pool", "install_worker_steps"]

log = logging.getLogger(__name__)

_KILLED = "; it did not stop within limits.cancel_grace_s and was killed"


def _pool_name(pool_cls: Any) -> str:
    """'prefork', 'threads', 'solo', ... from a class, 'module:Class' string or alias."""
    spec = pool_cls if isinstance(pool_cls, str) else f"{pool_cls.__module__}:{pool_cls.__name__}"
    module, _, cls = spec.partition(":")
    if not cls and "." in module:
        module, cls = module.rsplit(".", 1)
    name = module.rsplit(".", 1)[-1] if cls in ("", "TaskPool") else cls
    return {"thread": "threads", "processes": "prefork"}.get(name.lower(), name.lower())


def check_pool(pool_cls: Any) -> None:
    """Raise ``WorkerConfigError`` unless the pool enforces soft and hard time limits (prefork)."""
    name = _pool_name(pool_cls)
    if name == "prefork":
        return
    raise WorkerConfigError(
        f"unstuck refuses to start a worker with the {name!r} pool: only the prefork pool enforces "
        "soft and hard time limits, so hung tools could never be answered. Use --pool prefork "
        "(what `unstuck worker` does)."
    )


class PoolGuard(bootsteps.Step):
    """Stops worker start-up on a pool without time limits."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        try:
            check_pool(worker.pool_cls)
            # Load settings, tools and the Redis client now, before the pool forks: a child
            # forked while another thread holds the import lock would deadlock on import.
            # The memory guard too: every pool child inherits its cgroups.
            install_memory_guard(runtime().settings.limits.memory_cgroups)
        except (WorkerConfigError, ConfigError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        super().__init__(worker, **kwargs)


def _invoke_requests() -> list[Any]:
    # reserved_requests also holds requests whose start the pool has not acknowledged yet:
    # a child that dies right after claiming is still seen here.
    for _ in range(3):
        try:
            return [
                req for req in list(state.reserved_requests) if getattr(req.task, "name", None) == INVOKE_TASK
            ]
        except RuntimeError:  # the set changed size while copying; try again
            continue
    return []


def _job_keys(req: Any, prefix: str) -> tuple[RunKeys, str, float | None] | None:
    job = req.kwargs.get("job") if isinstance(req.kwargs, dict) else None
    if not isinstance(job, dict) or not isinstance(job.get("call"), dict):
        return None
    keys = RunKeys(prefix, str(job.get("session_key")), str(job.get("run_id")))
    beat = job.get("heartbeat_s")
    return keys, str(job["call"].get("id")), float(beat) if beat else None


class LeaseKeeper(bootsteps.StartStopStep):
    """Renews leases of running calls, answers calls whose pool child died, stops silent tools."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cancels: CancelEnforcer | None = None

    def start(self, worker: Any) -> None:
        """Start the renewal thread."""
        self._thread = threading.Thread(target=self._loop, name="unstuck-lease-keeper", daemon=True)
        self._thread.start()

    def stop(self, worker: Any) -> None:
        """Stop renewing (leases then lapse, and the gateway answers or re-runs the calls)."""
        self._stop.set()

    def _loop(self) -> None:
        interval = min(runtime().settings.lease.renew_interval_s, 0.5)
        while not self._stop.wait(interval):
            try:
                self._tick()
            except StoreError as exc:
                log.warning("lease renewal failed: %s", exc)

    def _tick(self) -> None:
        rt = runtime()
        jobs = [(req, found) for req in _invoke_requests() if (found := _job_keys(req, rt.ledger.prefix))]
        rows = rt.ledger.running_states([(keys, call_id) for _, (keys, call_id, _) in jobs])
        renew: list[tuple[RunKeys, str]] = []
        host, now = socket.gethostname(), now_ms()
        for (req, (keys, call_id, beat_s)), (call_state, worker, last_beat) in zip(jobs, rows, strict=True):
            call = RunningCall(call_state, worker, last_beat, beat_s)
            verdict = judge_running_call(call, host=host, child_alive=pid_alive(worker), now_ms=now)
            if verdict is ChildVerdict.RENEW:
                renew.append((keys, call_id))
            elif verdict is ChildVerdict.CHILD_DIED:
                answer_lost_child(req.kwargs, pid_of(worker), detail=f"pool process {worker} died")
            elif verdict is ChildVerdict.HEARTBEAT_STALE:
                self._interrupt(req, worker)
        rt.ledger.renew_leases(renew, worker_id(), now_ms=now)
        memory_guard().sweep(lambda pid: pid_alive(f"{host}:{pid}"))
        running = zip(jobs, rows, strict=True)
        self._enforce_cancels(
            [
                RunningJob(req.kwargs, keys, call_id, worker)
                for (req, (keys, call_id, _)), (_, worker, _) in running
                if worker.startswith(f"{host}:")  # never signal a pid of another host's worker
            ],
            now,
        )

    def _enforce_cancels(self, jobs: list[RunningJob], now: int) -> None:
        if self._cancels is None:
            rt = runtime()
            interval = min(rt.settings.lease.renew_interval_s, 0.5)
            self._cancels = CancelEnforcer(
                rt.ledger,
                grace_s=rt.settings.limits.cancel_grace_s,
                slack_s=interval + 0.5,  # a cooperative tool's own grace ends first, with its output
                answer=lambda job: answer_from_main_process(
                    job.kwargs, SyntheticReason.CANCELLED, detail=_KILLED
                ),
                interrupt=lambda job: self._signal_child(job.worker),
            )
        self._cancels.tick(jobs, now_ms=now)

    def _interrupt(self, req: Any, worker: str) -> None:
        answer_from_main_process(req.kwargs, SyntheticReason.HEARTBEAT_TIMEOUT)
        self._signal_child(worker)

    @staticmethod
    def _signal_child(worker: str) -> None:
        # SIGUSR1 is how the prefork pool delivers the soft limit: the tool unwinds and its
        # process groups are killed; the hard limit still applies if it ignores that.
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(worker.rsplit(":", 1)[-1]), signal.SIGUSR1)


def _redact_logs(logger: logging.Logger | None = None, **_: Any) -> None:
    install_log_redaction(logger)


def install_worker_steps(celery: Celery) -> None:
    """Add the guard and the lease keeper to ``celery``'s worker blueprint; redact worker logs."""
    celery.steps["worker"].add(PoolGuard)
    celery.steps["worker"].add(LeaseKeeper)
    signals.after_setup_logger.connect(_redact_logs, weak=False)
    signals.after_setup_task_logger.connect(_redact_logs, weak=False)
    signals.worker_shutdown.connect(_remove_memory_cgroups, weak=False)


def _remove_memory_cgroups(**_: Any) -> None:
    memory_guard().close()  # the pool is gone by now: nothing runs in this worker's cgroups
