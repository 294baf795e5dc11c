"""Suite-wide collection rules for running the tiers in parallel (pytest-xdist, ``--dist loadgroup``).

- Tests that share a module- or class-scoped fixture run on one xdist worker, so the fixture
  (a sweep over thousands of stored runs, a demo run, a Flower process) is built once, not once
  per worker that happens to draw one of its tests.
- ``serial`` tests (timing-sensitive fault tests that must not share the machine's cores) are
  left out of the parallel run; the Makefile runs them afterwards in a session of their own.
- Hypothesis checks properties, never speed: no per-example deadline and no "too slow" health
  check, which a loaded machine (the parallel tiers on two cores) trips on correct code.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("unstuck", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("unstuck")

_SHARED_SCOPES = frozenset({"module", "class", "package"})


def _shares_a_scoped_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope in _SHARED_SCOPES for defs in info.name2fixturedefs.values())


def pytest_itemcollected(item: pytest.Item) -> None:
    # Marked as each item is collected, before any collection_modifyitems hook (xdist's turns
    # the marks into its scheduling groups there).
    if _shares_a_scoped_fixture(item) and item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Test teardowns SIGKILL their workers (tests/harness.py: Proc.kill); a killed worker's
    # empty memory cgroup is removed by the next worker's start, and here for the last ones.
    from workers.worker.memory_cgroups import find_layout, remove_stale_workers

    layout = find_layout(os.getpid())
    if not isinstance(layout, str):
        remove_stale_workers(layout.own)
