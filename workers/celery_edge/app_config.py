"""Our settings as Celery settings, and an app configured with them: a leaf module.

The only place our settings become Celery setting names. It imports no task module, so the
agent process (the gateway) builds its sending app here without importing the worker's
entry point (:mod:`workers.celery_edge.app`, which installs the worker's bootsteps).
"""

from __future__ import annotations

import ssl
from typing import Any

from celery import Celery

from workers.celery_edge.message_signing import apply_signing, signing_config
from workers.celery_edge.names import HOUSEKEEPING_TASK, SWEEP_TASK
from workers.celery_edge.sentinel_transport import PRIMARY_CHECK_OPTION, serve_sentinel_urls
from workers.core.sentinel_url import is_sentinel_url
from workers.settings import Settings

__all__ = ["celery_config", "client_app", "configured_app"]


def _largest_hard_limit_s(settings: Settings) -> float:
    timeouts = [settings.agents.defaults.tools.timeout_s, *settings.tools.timeouts_s.values()]
    timeouts += [e.tool_timeout_s for e in settings.agents.list if e.tool_timeout_s]
    return max(timeouts) + settings.limits.hard_grace_s


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings derived from ours (JSON only, or signed JSON; prefetch 1, bounded publish retries)."""
    # Redelivery must never beat the ledger: keep the visibility timeout above any hard limit.
    visibility_s = max(3600, int(_largest_hard_limit_s(settings) * 2))
    publish_s = settings.broker.publish_timeout_s
    lock_s = settings.watchdog.sweep_lock_ttl_s
    config: dict[str, Any] = {
        "broker_url": settings.broker_url,
        # Every task ignores its result (results live in the ledger); a cluster cannot be one.
        "result_backend": None if settings.redis.cluster else settings.redis.url,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_default_queue": settings.broker.queue,
        # The watchdog's tasks go to their own queue, which no tool worker consumes, so hung
        # tools, a backlog of calls or dead tool workers can never delay a sweep.
        "task_routes": {
            SWEEP_TASK: {"queue": settings.broker.control_queue},
            HOUSEKEEPING_TASK: {"queue": settings.broker.control_queue},
        },
        # A sweep that hangs (a Redis stall) is stopped while it still holds its lock, so two
        # sweeps never act at once and the next one can run.
        "task_annotations": {
            name: {"soft_time_limit": lock_s * 0.8, "time_limit": lock_s * 0.9}
            for name in (SWEEP_TASK, HOUSEKEEPING_TASK)
        },
        "task_acks_late": False,
        "worker_prefetch_multiplier": settings.worker.prefetch_multiplier,
        # A worker takes messages ahead of its free pool processes (prefetch_multiplier per
        # process), so a child's next call is in hand when it frees: about 5 % more no-op calls
        # a second (docs/performance.md). A message held behind long-running calls would wait
        # for them while other workers idle, so what has not started within
        # worker.give_back_after_ms is published again (workers.worker.held_messages); 0 turns
        # both off, and the worker takes a message only for a free pool process (Redis broker;
        # Celery ignores this on RabbitMQ, whose prefetch is always on).
        "worker_disable_prefetch": settings.worker.give_back_after_ms == 0,
        "worker_send_task_events": True,
        # The gateway sends task-sent itself, batched (workers.celery_edge.task_events): Celery's cost a
        # publish per call.
        "task_send_sent_event": False,
        "task_track_started": False,
        "worker_hijack_root_logger": False,
        "broker_connection_retry_on_startup": True,
        "broker_connection_timeout": publish_s,
        "broker_transport_options": {
            "visibility_timeout": visibility_s,
            "socket_connect_timeout": publish_s,
            "socket_timeout": max(publish_s, 2.0),
            # A live Redis answers a worker's BRPOP within its 1 s server-side timeout; a
            # stopped or partitioned primary never answers and no socket timeout applies to
            # the event loop's wait, so the worker would keep waiting on it through a
            # failover. kombu drops a BRPOP whose reply is this much overdue (checked this
            # often): the wait one Redis command may take. 25 s by default.
            "health_check_interval": settings.redis.socket_timeout_s,
            # No kombu acks on Redis (its public transport option): kombu's emulation tracks
            # every taken message in `unacked` / `unacked_index`, two MULTI round trips and
            # eight commands per call in the worker's main process, to redeliver it after the
            # visibility timeout (>= 1 h), later than any call's deadline. The ledger answers
            # every registered call by its deadline whatever became of its message: a message
            # that dies with its worker's main process before its call was claimed is published
            # again by the waiting gateway a lease TTL later (gateway.republish_unclaimed).
            # RabbitMQ keeps its acks (the options below replace these).
            "ack_emulation": False,
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
        # One pooled broker connection per concurrent publisher: `unstuck serve` submits from
        # up to api.max_waiting threads, and Celery's default pool of 10 made the rest wait past
        # their publish timeout (answered dispatch_failed under load).
        "broker_pool_limit": max(10, settings.api.max_waiting),
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
    config.update(_sentinel_config(settings, config))
    config.update(signing_config(settings.broker.signing))
    return config


def _sentinel_options(settings: Settings) -> dict[str, Any]:
    """The Sentinel options of kombu and Celery: the primary's name and the Sentinels' own auth."""
    options: dict[str, Any] = {"master_name": settings.redis.sentinel_master}
    # One attempt per Sentinel (as the store's clients): redis-py asks the next one itself.
    sentinel_kwargs: dict[str, Any] = {"socket_timeout": settings.redis.socket_timeout_s, "retry": None}
    if settings.redis.sentinel_password.get_secret_value():
        sentinel_kwargs["password"] = settings.redis.sentinel_password.get_secret_value()
    if settings.redis.sentinel_tls:
        sentinel_kwargs["ssl"] = True
    options["sentinel_kwargs"] = sentinel_kwargs
    return options


def _sentinel_config(settings: Settings, config: dict[str, Any]) -> dict[str, Any]:
    """The broker and result backend on a ``sentinel://`` list follow the primary it names."""
    found: dict[str, Any] = {}
    if is_sentinel_url(settings.broker_url):
        transport = config["broker_transport_options"]
        found["broker_transport_options"] = {
            **transport,
            **_sentinel_options(settings),
            PRIMARY_CHECK_OPTION: settings.redis.primary_check_interval_ms / 1000,
        }
        if settings.redis.sentinel_tls:
            found["broker_use_ssl"] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    if is_sentinel_url(str(config["result_backend"] or "")):
        found["result_backend_transport_options"] = {
            **config["result_backend_transport_options"],
            **_sentinel_options(settings),
        }
        if settings.redis.sentinel_tls:
            found["redis_backend_use_ssl"] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    return found


def configured_app(settings: Settings, *, include: list[str], set_as_current: bool) -> Celery:
    """A Celery app with :func:`celery_config`, registering ``include`` (no beat schedule: see ``app.py``)."""
    if is_sentinel_url(settings.broker_url):
        serve_sentinel_urls()
    celery = Celery("unstuck", include=include, set_as_current=set_as_current)
    celery.conf.update(celery_config(settings))
    apply_signing(celery, settings.broker.signing)
    return celery


def client_app(settings: Settings) -> Celery:
    """An app that only sends (the gateway, the CLI): no task module, never the current app."""
    return configured_app(settings, include=[], set_as_current=False)
