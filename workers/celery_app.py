"""The Celery application: the only place our settings become Celery setting names."""

from __future__ import annotations

from functools import cache
from typing import Any

from celery import Celery

from beat_schedule import build_beat_schedule
from workers.settings import Settings, load_settings

__all__ = ["app", "celery_config", "create_app"]

app: Celery  # built lazily by __getattr__ below


def _largest_hard_limit_s(settings: Settings) -> float:
    timeouts = [settings.agents.defaults.tools.timeout_s, *settings.tools.timeouts_s.values()]
    timeouts += [e.tool_timeout_s for e in settings.agents.list if e.tool_timeout_s]
    return max(timeouts) + settings.limits.hard_grace_s


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings derived from ours (JSON only, prefetch 1, bounded publish retries)."""
    # Redelivery must never beat the ledger: keep the visibility timeout above any hard limit.
    visibility_s = max(3600, int(_largest_hard_limit_s(settings) * 2))
    publish_s = settings.broker.publish_timeout_s
    config: dict[str, Any] = {
        "broker_url": settings.broker_url,
        "result_backend": settings.redis.url,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_default_queue": settings.broker.queue,
        "task_acks_late": False,
        "worker_prefetch_multiplier": settings.worker.prefetch_multiplier,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_track_started": False,
        "worker_hijack_root_logger": False,
        "broker_connection_retry_on_startup": True,
        "broker_connection_timeout": publish_s,
        "broker_transport_options": {
            "visibility_timeout": visibility_s,
            "socket_connect_timeout": publish_s,
            "socket_timeout": max(publish_s, 2.0),
        },
        "result_backend_transport_options": {"visibility_timeout": visibility_s},
        "visibility_timeout": visibility_s,
        "task_publish_retry": True,
        "task_publish_retry_policy": {
            "max_retries": 2,
            "interval_start": 0,
            "interval_step": publish_s / 4,
            "interval_max": publish_s / 2,
        },
        "redis_socket_connect_timeout": publish_s,
        "redis_socket_timeout": max(publish_s, 2.0),
        "worker_max_memory_per_child": settings.worker.max_memory_per_child_kb,
        # A child killed before its start was acknowledged is reported lost after this
        # wait (default 10 s); keep it well under the lease TTL so the reason is `crashed`.
        "worker_lost_wait": min(1.0, settings.lease.ttl_s / 4),
    }
    if settings.broker_url.startswith(("amqp://", "amqps://", "pyamqp://")):
        # RabbitMQ: quorum queues (replicated, durable; they allow no priorities and no
        # global QoS, so prefetch stays per consumer), and publisher confirms so a call is
        # only marked dispatched once the broker has it. Redis transport options do not apply.
        config.update(
            {
                "task_default_queue_type": "quorum",
                "task_create_missing_queue_type": "quorum",
                "task_queue_max_priority": None,
                "worker_detect_quorum_queues": True,
                "broker_transport_options": {"confirm_publish": True},
            }
        )
    return config


def create_app(settings: Settings | None = None, *, worker: bool = True) -> Celery:
    """A Celery app configured from ``settings`` (default: the environment).

    ``worker=False`` gives a client-only app (the gateway) without the worker bootsteps.
    """
    settings = settings or load_settings()
    celery = Celery("unstuck", include=["tasks.invoke", "tasks.control"], set_as_current=worker)
    celery.conf.update(celery_config(settings))
    celery.conf.beat_schedule = build_beat_schedule(settings)
    if worker:
        from tasks.worker_steps import install_worker_steps

        install_worker_steps(celery)
    return celery


@cache
def _worker_app() -> Celery:
    return create_app()


def __getattr__(name: str) -> Any:
    # Built on first use, so importing the task-name constants costs nothing and cannot
    # fail on configuration; `celery -A workers.celery_app` still finds `app`.
    if name == "app":
        return _worker_app()
    raise AttributeError(name)
