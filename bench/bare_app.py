"""The baseline of ``bench.overhead``: a plain Celery app, configured the way Celery's docs show.

Nothing here goes through unstuck's settings or Celery config: a Redis broker and a Redis
result backend at ``BENCH_BARE_REDIS_URL``, JSON, a no-op task, Celery's defaults for the
rest. Started as ``python -m celery -A bench.bare_app worker --pool prefork`` on its own
queue, so it never consumes unstuck's messages; the client waits with ``.get()``.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from celery import Celery

__all__ = ["BARE_QUEUE", "BARE_TASK", "URL_ENV", "app", "make_app"]

app: Celery  # built lazily by __getattr__ below

BARE_QUEUE = "bench.bare"
BARE_TASK = "bench.noop"
URL_ENV = "BENCH_BARE_REDIS_URL"


def make_app(url: str | None = None) -> Celery:
    """``Celery(broker=url, backend=url)`` with JSON, as a user would write it."""
    url = url or os.environ[URL_ENV]
    celery = Celery("bench_bare", broker=url, backend=url, set_as_current=False)
    celery.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_default_queue=BARE_QUEUE,
        broker_connection_retry_on_startup=True,
    )
    celery.task(name=BARE_TASK)(_noop)
    return celery


def _noop() -> str:
    return "ok"


@cache
def _worker_app() -> Celery:
    return make_app()


def __getattr__(name: str) -> Any:
    # Built on first use so that importing the constants reads no environment.
    if name == "app":
        return _worker_app()
    raise AttributeError(name)
