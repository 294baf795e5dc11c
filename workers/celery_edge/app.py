"""The Celery app of each process role: ``celery -A workers.celery_edge.app`` finds them here.

Their settings come from :mod:`workers.celery_edge.app_config`, a leaf the gateway uses on its own.
The task modules are named, never imported (as Celery's ``include`` does): ``tasks/`` imports
this module, and nothing under ``workers`` imports ``tasks``.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

from celery import Celery

from workers.celery_edge.app_config import celery_config, client_app, configured_app
from workers.settings import Settings, load_settings

__all__ = ["Role", "app", "celery_config", "control_app", "create_app"]

app: Celery  # the tool worker's app, built lazily by __getattr__ below
control_app: Celery  # the watchdog's (control queue consumer and beat), likewise

Role = Literal["worker", "control", "client"]
"""Which process an app is for: a tool worker, the watchdog/beat, or a client that only sends."""

# Each process registers only its own tasks: a tool worker cannot run a sweep, and the
# watchdog cannot run a tool even if an invoke message reached the control queue.
_TASK_MODULES: dict[Role, list[str]] = {
    "worker": ["tasks.invoke"],
    "control": ["tasks.control"],
}


def create_app(settings: Settings | None = None, *, role: Role = "worker") -> Celery:
    """A Celery app configured from ``settings`` (default: the environment) for one ``role``.

    ``worker`` registers the invoke task and the worker bootsteps; ``control`` registers the
    watchdog's tasks; ``client`` (the gateway, the CLI) registers nothing and only sends.
    """
    settings = settings or load_settings()
    if role == "client":
        return client_app(settings)
    celery = configured_app(settings, include=_TASK_MODULES[role], set_as_current=True)
    # Both consuming roles: no message body can stop the consumer, each refusal is counted,
    # and task events are published in batches (broker.task_events_flush_ms).
    celery.conf.worker_consumer = "workers.celery_edge.consumer:RefusingConsumer"
    if role == "control":
        # Only beat and the watchdog load the schedule; a sending client or a tool worker never
        # imports it (the root module reads the watchdog's settings).
        from beat_schedule import build_beat_schedule

        celery.conf.beat_schedule = build_beat_schedule(settings)
    if role == "worker":
        from workers.celery_edge.bootsteps import install_worker_steps

        install_worker_steps(celery)
    return celery


@cache
def _app(role: Role) -> Celery:
    return create_app(role=role)


def __getattr__(name: str) -> Any:
    # Built on first use, so importing this module costs nothing and cannot fail on
    # configuration; `celery -A workers.celery_edge.app` finds `app`, and
    # `celery -A workers.celery_edge.app:control_app` the watchdog's.
    if name == "app":
        return _app("worker")
    if name == "control_app":
        return _app("control")
    raise AttributeError(name)
