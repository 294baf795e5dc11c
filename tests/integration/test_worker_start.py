"""``celery -A workers.celery_edge.app worker`` itself: the app path the CLI and deploy/ name.

Pins what :class:`workers.celery_edge.bootsteps.PoolGuard` relies on: Celery builds the worker
blueprint's steps with the worker, whose ``pool_cls`` is the pool asked for on the command line.
"""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.timeout(60)
def test_a_celery_worker_asked_for_a_pool_without_time_limits_stops_at_start(env: dict[str, str]) -> None:
    # When a worker of the tool app is started by hand with the solo pool
    argv = [sys.executable, "-m", "celery", "-A", "workers.celery_edge.app", "worker", "--pool", "solo"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=50, check=False)
    # Then it refuses before running anything, and says why
    assert done.returncode == 2, done.stderr[-2000:]
    assert "unstuck refuses to start a worker with the 'solo' pool" in done.stderr
