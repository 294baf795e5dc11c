"""The tool worker's bootsteps: refuse pools that cannot enforce limits; keep leases; redact logs.

Both steps run in the worker's main process, which survives a hung or killed pool child;
what a lease-keeping tick does is the worker's (:class:`workers.worker.lease_keeper.LeaseKeeper`).
They use only Celery's public bootsteps and signals; the calls the keeper watches are those the
pool children write into their slots (:mod:`workers.worker.child_slots`), each child at its pool
index (billiard's process ``index``, Celery's ``%I``).
"""

from __future__ import annotations

import functools
import logging
import socket
import sys
import threading
from typing import Any

from billiard.process import current_process
from celery import Celery, bootsteps, signals

from workers import tracing
from workers.celery_edge.child_exits import install_child_exits
from workers.celery_edge.give_back import GiveBack
from workers.core.mcp_upstreams import served_upstream
from workers.core.redact import install_log_redaction
from workers.errors import ConfigError, StoreError, WorkerConfigError
from workers.runtime import runtime
from workers.tools.upstreams import start_sessions, stop_sessions
from workers.worker.child_slots import HeldJobs, install_child_slots, set_child_index
from workers.worker.lease_keeper import LeaseKeeper, renew_interval_s
from workers.worker.lost_calls import pid_alive
from workers.worker.memory_guard import install_memory_guard, memory_guard

__all__ = ["LeaseKeeping", "PoolGuard", "check_pool", "install_worker_steps"]

log = logging.getLogger(__name__)

_EXIT_FLUSH_WAIT_S = 5.0  # how long an exiting pool child waits for its last spans to be sent


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
            # Tracing's imports and provider too: a child's first span must not spend a call's
            # time limit, nor inherit a lock another thread held (workers.tracing.setup.preload).
            tracing.preload()
        except (WorkerConfigError, ConfigError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        super().__init__(worker, **kwargs)


class LeaseKeeping(bootsteps.StartStopStep):
    """Runs the lease keeper's ticks on a thread over the calls this worker's pool children run.

    It makes the children's slots when the worker is built, so every child the pool forks,
    now or later, shares them: one per pool process the worker may run (``--autoscale``'s
    maximum when that is higher).
    """

    def __init__(self, worker: Any, autoscale: Any = None, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._keeper = LeaseKeeper()
        slots = install_child_slots(
            _pool_size(worker.concurrency, autoscale),
            max_argument_bytes=runtime().settings.limits.max_argument_bytes,
        )
        host = socket.gethostname()
        self._held = HeldJobs(slots, alive=lambda pid: pid_alive(f"{host}:{pid}"))

    def start(self, worker: Any) -> None:
        """Start the renewal thread."""
        self._thread = threading.Thread(target=self._loop, name="unstuck-lease-keeper", daemon=True)
        self._thread.start()

    def stop(self, worker: Any) -> None:
        """Stop renewing (leases then lapse, and the gateway answers or re-runs the calls)."""
        self._stop.set()

    def _loop(self) -> None:
        interval = renew_interval_s()
        while not self._stop.wait(interval):
            try:
                self._keeper.tick(self._held.running())
            except StoreError as exc:
                log.warning("lease renewal failed: %s", exc)
            except Exception:  # the keeper must outlive one bad tick: a dead thread renews nothing
                log.exception("lease keeper tick failed")


def _pool_size(concurrency: Any, autoscale: Any) -> int:
    """The most pool processes a worker runs: ``-c``, or ``--autoscale``'s maximum ("max,min")."""
    if isinstance(autoscale, str):
        autoscale = [int(part) for part in autoscale.split(",") if part.strip()]
    most = max(autoscale) if autoscale else 0
    return max(int(concurrency or 1), int(most))


def _take_child_slot(**_: Any) -> None:
    # The pool numbers its processes 0 .. size - 1 (a replacement takes the index it frees).
    set_child_index(getattr(current_process(), "index", None))


def _redact_logs(logger: logging.Logger | None = None, **_: Any) -> None:
    install_log_redaction(logger)


# The loggers of Celery's per-task INFO lines: "Received task" (the main process) and "succeeded
# in", "raised expected", "ignored" (the pool child). Each reads its level once, when the worker
# starts (the strategy) or builds a task's tracer (the child), and skips the line, its record
# and its text entirely above INFO.
_TASK_LINE_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


def _task_lines(**_: Any) -> None:
    if not runtime().settings.worker.log_each_task:
        for name in _TASK_LINE_LOGGERS:
            logger = logging.getLogger(name)
            if logger.getEffectiveLevel() < logging.WARNING:
                logger.setLevel(logging.WARNING)


def install_worker_steps(celery: Celery) -> None:
    """Add the worker's steps (pool guard, lease keeper, give-back, child exits); redact logs."""
    celery.steps["worker"].add(PoolGuard)
    celery.steps["worker"].add(LeaseKeeping)
    celery.steps["worker"].add(GiveBack)
    install_child_exits(celery.steps["worker"])
    signals.after_setup_logger.connect(_redact_logs, weak=False)
    signals.after_setup_logger.connect(_task_lines, weak=False)
    signals.after_setup_task_logger.connect(_redact_logs, weak=False)
    signals.worker_shutdown.connect(_remove_memory_cgroups, weak=False)
    signals.worker_process_init.connect(_take_child_slot, weak=False)
    signals.worker_process_init.connect(_start_tracing, weak=False)
    signals.worker_process_init.connect(functools.partial(_start_upstreams, celery), weak=False)
    signals.worker_process_shutdown.connect(_flush_spans, weak=False)
    signals.worker_process_shutdown.connect(_stop_upstreams, weak=False)


def _start_tracing(**_: Any) -> None:
    tracing.active()  # a pool child sets its tracer provider up before its first call, if traced


def _start_upstreams(celery: Celery, **_: Any) -> None:
    # The MCP upstreams' sessions start with the pool child, not inside its first call's limits.
    # A worker started for a stateful upstream consumes its queue (unstuck worker --upstream):
    # the parent selected the queues before it forked this child.
    settings = runtime().settings
    serving = served_upstream(settings.broker.queue, celery.amqp.queues.consume_from or ())
    start_sessions(settings.mcp.upstreams(), serving=serving)


def _stop_upstreams(**_: Any) -> None:
    stop_sessions()  # the child leaves through os._exit: its upstreams would outlive it


def _flush_spans(**_: Any) -> None:
    # A pool child leaves through os._exit (recycled, or the pool shut down): the SDK's atexit
    # shutdown never runs there, and what its batch still held would go with the child. It
    # waits longer than after a call, but never more than a slow collector is worth.
    if tracing.active():
        tracing.flush(wait_s=_EXIT_FLUSH_WAIT_S)


def _remove_memory_cgroups(**_: Any) -> None:
    memory_guard().close()  # the pool is gone by now: nothing runs in this worker's cgroups
