"""A bare Celery app for ``bench.overhead``: unstuck's broker/backend config, a no-op task, no guards.

Started as ``python -m celery -A bench.bare_app worker --pool prefork`` on its own queue, so
it never consumes unstuck's messages. Its settings come from the same ``UNSTUCK_*`` env.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from celery import Celery

from workers.celery_app import celery_config
from workers.settings import load_settings

__all__ = ["BARE_QUEUE", "BARE_TASK", "app", "make_app"]

app: Celery  # built lazily by __getattr__ below

BARE_QUEUE = "bench.bare"
BARE_TASK = "bench.noop"


def make_app() -> Celery:
    """A Celery app like unstuck's (same broker, result backend, serializers), on the bare queue."""
    celery = Celery("bench_bare", set_as_current=False)
    config = celery_config(load_settings())
    config["task_default_queue"] = BARE_QUEUE
    celery.conf.update(config)
    celery.task(name=BARE_TASK)(_noop)
    return celery


def _noop() -> str:
    return "ok"


@cache
def _worker_app() -> Celery:
    return make_app()


def __getattr__(name: str) -> Any:
    # Built on first use so that importing the constants reads no settings.
    if name == "app":
        return _worker_app()
    raise AttributeError(name)
