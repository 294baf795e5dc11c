"""What a per-call memory limit adds to a healthy call: the guard around an empty tool.

Measures, in this process (standing in for a pool child), one call's enter and exit of
``MemoryGuard.limit`` with no limit (the baseline: what every call paid before), with the
rlimit alone, and with the pool child's cgroup re-armed for the call (its usage read, its
limit written, its OOM kills read) where this process may create one; and the lease
keeper's sweep of the worker's cgroup directory (once per 5 s, not per call).
Paths run in turn, round by round, and the best round of each is kept, so the machine's
load falls on all of them alike.

Run: ``python -m bench.memory_limits``
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from workers.worker.memory_cgroups import MemoryCgroups, open_memory_cgroups
from workers.worker.memory_guard import MemoryGuard

CALLS = 500
ROUNDS = 7
LIMIT_MB = 256
BASELINE = "no limit (baseline)"


def _calls(guard: MemoryGuard, limit_mb: int | None) -> Callable[[], None]:
    def run() -> None:
        for _ in range(CALLS):
            with guard.limit(limit_mb):
                pass

    return run


def _sweeps(cgroups: MemoryCgroups) -> Callable[[], None]:
    def run() -> None:
        for _ in range(CALLS):
            cgroups.sweep(lambda _pid: True)

    return run


def best_us_per_call(runs: dict[str, Callable[[], None]]) -> dict[str, float]:
    """The fastest round of each path, in microseconds per call."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(ROUNDS):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            best[name] = min(best[name], (time.perf_counter() - started) / CALLS * 1e6)
    return best


def main() -> None:
    """Print microseconds per call for each path and the added cost against the baseline."""
    cgroups = open_memory_cgroups(os.getpid())
    runs = {
        BASELINE: _calls(MemoryGuard(None), None),
        f"rlimit only ({LIMIT_MB} MB)": _calls(MemoryGuard(None), LIMIT_MB),
    }
    if isinstance(cgroups, MemoryCgroups):
        with_cgroups = MemoryGuard(cgroups)
        runs[f"cgroup, re-armed per call ({LIMIT_MB} MB, v{cgroups.layout.version})"] = _calls(
            with_cgroups, LIMIT_MB
        )
        runs["lease keeper sweep (once per 5 s, not per call)"] = _sweeps(cgroups)
    else:
        print(f"no cgroup per call here ({cgroups}): rlimit only")
    try:
        best = best_us_per_call(runs)
    finally:
        if isinstance(cgroups, MemoryCgroups):
            cgroups.close()
    base = best[BASELINE]
    print(f"memory limits: best of {ROUNDS} rounds of {CALLS} calls, microseconds per call")
    for name, us in best.items():
        added = "" if name == BASELINE else f"  (+{us - base:8.1f} us, x{us / base:6.1f})"
        print(f"  {name:<55} {us:9.1f} us{added}")


if __name__ == "__main__":
    main()
