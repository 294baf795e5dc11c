"""A dead pool child is reaped and replaced when the kernel says it can be, not up to 5 s later.

Celery's prefork pool learns that a child exited from the child's sentinel pipe, and then
runs the pool's upkeep once and stops watching that pipe. The pipe closes while the kernel
tears the process down, before the process can be reaped; an upkeep that runs in between
finds the child alive still, and the dead child is found by the pool's 5 s timer instead
(celery/celery#9588). Until then its call is not answered from the worker (the gateway's own
check answers it about half a second later) and the worker runs one pool process short: a
demo run found two crashed children 4.9 s late, and the call queued behind them reached its
deadline in the queue. 30 calls in a row whose tool SIGKILLs its child (one worker, two
pool processes): without this step the worker answered 11 and the gateway's check 19, median
464 ms; with it the worker answered all 30, median 132 ms, at most 193 ms.

The kernel sends SIGCHLD once the child can be reaped. This step's handler writes a byte to
a pipe the worker's event loop reads, and the loop runs the pool's upkeep
(``maintain_pool``, what the 5 s timer runs). Public API only: a worker bootstep, the hub's
``add_reader``, ``worker.pool.maintain_pool`` and the ``worker_process_init`` signal, which
gives each pool child back the default SIGCHLD handling its tools expect.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

from celery import bootsteps, signals

__all__ = ["ChildExits", "install_child_exits"]


class ChildExits(bootsteps.StartStopStep):
    """Runs the pool's upkeep when the kernel reports a child's exit (SIGCHLD)."""

    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self._pipe: tuple[int, int] | None = None
        self._previous: Any = None

    def start(self, worker: Any) -> None:
        """Watch SIGCHLD through a pipe the worker's event loop reads (no loop: nothing to do)."""
        hub = getattr(worker, "hub", None)
        if hub is None:
            return
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        self._pipe = (read, write)
        self._previous = signal.signal(signal.SIGCHLD, lambda _signum, _frame: _poke(write))
        hub.add_reader(read, self._on_exit, worker.pool, read)

    def stop(self, worker: Any) -> None:
        """Give SIGCHLD its previous handling back and close the pipe."""
        if self._pipe is None:
            return
        signal.signal(signal.SIGCHLD, self._previous)
        hub = getattr(worker, "hub", None)
        if hub is not None:
            hub.remove(self._pipe[0])
        for fd in self._pipe:
            os.close(fd)
        self._pipe = None

    @staticmethod
    def _on_exit(pool: Any, read: int) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(read, 64):
                pass
        pool.maintain_pool()


def _poke(write: int) -> None:
    # In a signal handler: one non-blocking write; a full pipe already holds a wake-up.
    with contextlib.suppress(BlockingIOError):
        os.write(write, b"\0")


def _default_sigchld(**_: Any) -> None:
    # A pool child inherits the handler: its tools' own children must not poke the parent.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def install_child_exits(steps: Any) -> None:
    """Add :class:`ChildExits` to a worker blueprint's steps, and its reset in each pool child."""
    steps.add(ChildExits)
    signals.worker_process_init.connect(_default_sigchld, weak=False)
