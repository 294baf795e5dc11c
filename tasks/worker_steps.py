"""Worker bootsteps: refuse pools that cannot enforce limits; keep leases; enforce heartbeats.

Both run in the worker's main process, which survives a hung or killed pool child.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Any

from celery import Celery, bootsteps
from celery.worker import state

from tasks.requests import answer_from_main_process
from workers.celery_app import INVOKE_TASK
from workers.core.heartbeats import stale_heartbeats
from workers.core.models import SyntheticReason
from workers.errors import ConfigError, StoreError, WorkerConfigError
from workers.runtime import now_ms, runtime, worker_id
from workers.store.keys import RunKeys

__all__ = ["LeaseKeeper", "PoolGuard", "check_pool", "install_worker_steps"]

log = logging.getLogger(__name__)

_LIMIT_ENFORCING_POOLS = {"prefork", "processes"}


def check_pool(pool_cls: Any) -> None:
    """Raise ``WorkerConfigError`` unless the pool enforces soft and hard time limits (prefork)."""
    name = pool_cls if isinstance(pool_cls, str) else f"{pool_cls.__module__}.{pool_cls.__name__}"
    short = name.rsplit(":", 1)[-1].rsplit(".", 1)[-1].lower()
    if short in _LIMIT_ENFORCING_POOLS or name.startswith("celery.concurrency.prefork"):
        return
    raise WorkerConfigError(
        f"unstuck refuses to start a worker with the {short!r} pool: only the prefork pool enforces "
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
            runtime()
        except (WorkerConfigError, ConfigError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        super().__init__(worker, **kwargs)


def _invoke_requests() -> list[Any]:
    return [req for req in list(state.active_requests) if req.name == INVOKE_TASK]


def _job_keys(req: Any, prefix: str) -> tuple[RunKeys, str, dict[str, Any]] | None:
    job = req.kwargs.get("job") if isinstance(req.kwargs, dict) else None
    if not isinstance(job, dict) or not isinstance(job.get("call"), dict):
        return None
    keys = RunKeys(prefix, str(job.get("session_key")), str(job.get("run_id")))
    return keys, str(job["call"].get("id")), job


class LeaseKeeper(bootsteps.StartStopStep):
    """Renews the lease of every running call and stops tools whose heartbeat went stale."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, worker: Any) -> None:
        """Start the renewal thread."""
        self._thread = threading.Thread(target=self._loop, name="unstuck-lease-keeper", daemon=True)
        self._thread.start()

    def stop(self, worker: Any) -> None:
        """Stop renewing (leases then lapse, and the gateway answers or re-runs the calls)."""
        self._stop.set()

    def _loop(self) -> None:
        interval = runtime().settings.lease.renew_interval_s
        while not self._stop.wait(interval):
            try:
                self._tick()
            except StoreError as exc:
                log.warning("lease renewal failed: %s", exc)

    def _tick(self) -> None:
        rt = runtime()
        jobs = [(req, found) for req in _invoke_requests() if (found := _job_keys(req, rt.ledger.prefix))]
        rt.ledger.renew_leases([keys.lease(call_id) for _, (keys, call_id, _) in jobs], worker_id())
        watched = [(req, keys, call_id, job) for req, (keys, call_id, job) in jobs if job.get("heartbeat_s")]
        if watched:
            self._enforce_heartbeats(watched)

    def _enforce_heartbeats(self, watched: list[tuple[Any, RunKeys, str, dict[str, Any]]]) -> None:
        rt = runtime()
        beats = {}
        for req, keys, call_id, job in watched:
            record = rt.ledger.record(keys, call_id)
            if record is not None and record.result is None:
                beats[req.id] = (int(record.fields.get("hb_ms", "0")), float(job["heartbeat_s"]))
        for req, *_ in watched:
            if req.id in stale_heartbeats(beats, now_ms=now_ms()):
                self._interrupt(req)

    def _interrupt(self, req: Any) -> None:
        answer_from_main_process(req.kwargs, SyntheticReason.HEARTBEAT_TIMEOUT)
        # SIGUSR1 is how the prefork pool delivers the soft limit: the tool unwinds and its
        # process groups are killed; the hard limit still applies if it ignores that.
        if req.worker_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(req.worker_pid, signal.SIGUSR1)


def install_worker_steps(celery: Celery) -> None:
    """Add the guard and the lease keeper to ``celery``'s worker blueprint."""
    celery.steps["worker"].add(PoolGuard)
    celery.steps["worker"].add(LeaseKeeper)
