"""The Celery config per broker: Redis keeps its transport options, RabbitMQ gets quorum queues."""

from __future__ import annotations

import pytest

from workers.celery_edge.app import celery_config
from workers.settings import Settings

REDIS = "redis://127.0.0.1:6390/0"


def _config(broker_url: str) -> dict[str, object]:
    return celery_config(Settings(redis={"url": REDIS}, broker={"url": broker_url, "queue": "q1"}))


def test_redis_broker_keeps_visibility_timeout_and_classic_queues() -> None:
    config = _config("")
    assert config["broker_url"] == REDIS
    options = config["broker_transport_options"]
    assert isinstance(options, dict)
    assert options["visibility_timeout"] >= 3600
    assert "task_default_queue_type" not in config


def test_a_redis_broker_drops_a_brpop_overdue_by_one_command_timeout() -> None:
    # kombu drops a BRPOP connection whose reply is brpop_timeout + health_check_interval
    # overdue: a worker leaves a silent (stopped, partitioned) primary after that, not 26 s.
    settings = Settings(redis={"url": REDIS, "socket_timeout_s": 3.5})
    options = celery_config(settings)["broker_transport_options"]
    assert isinstance(options, dict)
    assert options["health_check_interval"] == 3.5


def test_a_worker_takes_messages_ahead_only_while_it_gives_back_what_waits() -> None:
    # Prefetch is safe only with the give-back (workers/worker/held_messages.py): 0 turns both off.
    on = Settings(redis={"url": REDIS})
    off = Settings(redis={"url": REDIS}, worker={"give_back_after_ms": 0})
    assert on.worker.give_back_after_ms > 0
    assert celery_config(on)["worker_disable_prefetch"] is False
    assert celery_config(off)["worker_disable_prefetch"] is True


@pytest.mark.parametrize(
    "url", ["amqp://guest:guest@127.0.0.1:5672//", "amqps://u:p@mq.example:5671/v", "pyamqp://h//"]
)
def test_amqp_broker_declares_quorum_queues_without_priorities_or_global_qos(url: str) -> None:
    config = _config(url)
    assert config["broker_url"] == url
    assert config["task_default_queue"] == "q1"
    assert config["task_default_queue_type"] == "quorum"
    assert config["task_create_missing_queue_type"] == "quorum"
    assert config["task_queue_max_priority"] is None
    assert config["worker_detect_quorum_queues"] is True
    assert config["broker_transport_options"] == {"confirm_publish": True}
    # Unchanged guarantees: JSON only, prefetch 1, no late acks, ledger stays on Redis.
    assert config["accept_content"] == ["json"]
    assert config["worker_prefetch_multiplier"] == 1
    assert config["task_acks_late"] is False
    assert config["result_backend"] == REDIS


def test_amqp_queue_is_declared_durable_with_the_quorum_argument() -> None:
    from celery import Celery

    app = Celery("t", set_as_current=False)
    app.conf.update(_config("amqp://guest:guest@127.0.0.1:5672//"))
    queue = app.amqp.queues["q1"]
    assert queue.durable is True
    assert queue.queue_arguments == {"x-queue-type": "quorum"}


def test_a_cluster_store_is_never_the_result_backend() -> None:
    # Every task ignores its result; a cluster node as Celery's backend would answer MOVED
    single = celery_config(Settings(redis={"url": "redis://r:6379/0"}))
    cluster = celery_config(
        Settings(redis={"url": "redis://node-1:7000/0", "cluster": True}, broker={"url": "redis://q:6379/0"})
    )
    assert single["result_backend"] == "redis://r:6379/0"
    assert (cluster["result_backend"], cluster["broker_url"]) == (None, "redis://q:6379/0")
