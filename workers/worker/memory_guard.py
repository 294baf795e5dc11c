"""Per-call memory limits in the worker: a cgroup re-armed per call, else ``RLIMIT_DATA``.

Installed once in the worker's main process before the pool forks (it logs once which of
the two is in force); each pool child uses the copy it inherited for every call.

With a cgroup (one per pool child, its limit re-armed per call) the kernel bounds the
call's pool child and every process it starts together, exactly, and an OOM kill inside
it is counted, so a child killed for memory is answered ``out_of_memory``, not ``crashed``.
No rlimit is set then: an rlimit is inherited by each process the tool starts, where a
large allocation would fail with the process's own error (an exit status the tool reports
as it likes) before the cgroup could count it. Without a cgroup the pool child's
``RLIMIT_DATA`` is lowered to what it maps now plus the limit for the call and restored
after; each process the tool starts inherits that bound on its own memory. A
``MemoryError`` in the child is ``out_of_memory`` either way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from workers.core.memory_limits import MIB, data_rlimit_bytes
from workers.worker.memory_cgroups import MemoryCgroups, open_memory_cgroups

__all__ = ["CallMemory", "MemoryGuard", "install_memory_guard", "memory_guard"]

log = logging.getLogger(__name__)

# How long a dead child's call cgroup is kept for the paths that answer its call to read.
_DEAD_CHILD_GRACE_S = 5.0
# The lease keeper asks for a sweep on every tick; a dead child's cgroup may wait this long,
# and listing the directory costs more than a whole limited call (docs/performance.md).
_SWEEP_INTERVAL_S = 5.0
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class CallMemory:
    """One call's memory limit as it ran: where it was enforced and what the kernel did."""

    limit_mb: int | None
    cgroup: Path | None = None
    oom_kills: int = 0  # processes of the call the kernel's OOM killer killed


def _mapped_data_bytes() -> int:
    # /proc/self/statm's sixth field: data + stack pages, what RLIMIT_DATA counts (and a bit).
    fd = os.open("/proc/self/statm", os.O_RDONLY)
    try:
        return int(os.read(fd, 256).split()[5]) * _PAGE
    finally:
        os.close(fd)


class MemoryGuard:
    """Applies a call's memory limit in a pool child and reads what became of it."""

    def __init__(self, cgroups: MemoryCgroups | None) -> None:
        self.cgroups = cgroups
        self._data_limit = resource.getrlimit(resource.RLIMIT_DATA)
        self._cgroup_failed_in: int | None = None
        self._dead_since: dict[int, float] = {}
        self._last_sweep_s = float("-inf")

    @contextlib.contextmanager
    def limit(self, limit_mb: int | None) -> Iterator[CallMemory]:
        """Run the block under ``limit_mb`` (None: unlimited); the limit is lifted on any exit."""
        memory = CallMemory(limit_mb)
        if limit_mb is None:
            if self.cgroups is not None:
                self.cgroups.unbound()  # a child that ran limited calls is in its cgroup still
            yield memory
            return
        pid = os.getpid()
        memory.cgroup = self._arm_cgroup(pid, limit_mb)
        try:
            if memory.cgroup is None:
                soft = data_rlimit_bytes(_mapped_data_bytes(), limit_mb, self._data_limit[1])
                resource.setrlimit(resource.RLIMIT_DATA, (soft, self._data_limit[1]))
            yield memory
        finally:
            if memory.cgroup is None:
                resource.setrlimit(resource.RLIMIT_DATA, self._data_limit)
            elif self.cgroups is not None:
                memory.oom_kills = self.cgroups.finish(memory.cgroup, pid)

    def _arm_cgroup(self, pid: int, limit_mb: int) -> Path | None:
        if self.cgroups is None:
            return None
        try:
            return self.cgroups.arm(pid, limit_mb * MIB)
        except OSError as exc:
            if self._cgroup_failed_in != pid:  # once per pool child, not once per call
                self._cgroup_failed_in = pid
                log.warning(
                    "memory limits: no cgroup for calls in pool process %d (%s): rlimits only", pid, exc
                )
            return None

    def lost_child_oom_kills(self, pid: int) -> int:
        """OOM kills in the cgroup of the call dead pool child ``pid`` was running (main process)."""
        if self.cgroups is None:
            return 0
        return self.cgroups.oom_kills(self.cgroups.layout.call_dir(pid))

    def sweep(self, alive: Callable[[int], bool], now_s: float | None = None) -> None:
        """Remove call cgroups of pool children dead for a while (main process, lease keeper)."""
        now = time.monotonic() if now_s is None else now_s
        if self.cgroups is None or now - self._last_sweep_s < _SWEEP_INTERVAL_S:
            return
        self._last_sweep_s = now

        def still_needed(pid: int) -> bool:
            if alive(pid):
                self._dead_since.pop(pid, None)
                return True
            return now - self._dead_since.setdefault(pid, now) < _DEAD_CHILD_GRACE_S

        self.cgroups.sweep(still_needed)
        self._dead_since = {
            pid: t for pid, t in self._dead_since.items() if now - t < 60 * _DEAD_CHILD_GRACE_S
        }

    def close(self) -> None:
        """Remove this worker's cgroups (worker shutdown)."""
        if self.cgroups is not None:
            self.cgroups.close()


_GUARD: MemoryGuard | None = None


def install_memory_guard(use_cgroups: bool) -> MemoryGuard:
    """Set up memory limits in the worker's main process (before the pool forks); logs the mode once."""
    global _GUARD
    if _GUARD is not None:
        return _GUARD
    cgroups: MemoryCgroups | str = "limits.memory_cgroups is off"
    if use_cgroups:
        cgroups = open_memory_cgroups(os.getpid())
    if isinstance(cgroups, str):
        log.warning(
            "memory limits: no cgroup per call (%s); falling back to rlimits (RLIMIT_DATA): each process "
            "a call starts is bounded on its own, and a process killed for memory is reported as the "
            "tool reports it",
            cgroups,
        )
        _GUARD = MemoryGuard(None)
    else:
        log.info(
            "memory limits: a cgroup per call under %s (cgroup v%d)",
            cgroups.layout.parent,
            cgroups.layout.version,
        )
        _GUARD = MemoryGuard(cgroups)
    return _GUARD


def memory_guard() -> MemoryGuard:
    """The worker's guard; rlimits only where none was installed (a process that is no worker)."""
    global _GUARD
    if _GUARD is None:
        _GUARD = MemoryGuard(None)
    return _GUARD
