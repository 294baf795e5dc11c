"""The worker refuses pools that cannot enforce time limits (imports Celery, needs no Redis)."""

from __future__ import annotations

import pytest
from celery.concurrency import get_implementation
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.concurrency.solo import TaskPool as SoloPool
from celery.concurrency.thread import TaskPool as ThreadPool

from workers.celery_edge.bootsteps import check_pool
from workers.errors import UnstuckError, WorkerConfigError


@pytest.mark.parametrize(
    "pool",
    [
        PreforkPool,
        "prefork",
        "PREFORK",
        "processes",
        "celery.concurrency.prefork:TaskPool",
        "celery.concurrency.prefork.TaskPool",
        get_implementation("prefork"),
        get_implementation("processes"),
    ],
)
def test_prefork_is_accepted(pool: object) -> None:
    check_pool(pool)  # does not raise


@pytest.mark.parametrize(
    "pool",
    [
        ThreadPool,
        SoloPool,
        get_implementation("threads"),
        "threads",
        "solo",
        "gevent",
        "eventlet",
        "celery.concurrency.thread:TaskPool",
        "celery.concurrency.gevent:TaskPool",
        "celery.concurrency.eventlet:TaskPool",
    ],
)
def test_pools_without_time_limits_are_refused(pool: object) -> None:
    # When
    with pytest.raises(WorkerConfigError) as info:
        check_pool(pool)
    # Then the message says why and what to do
    message = str(info.value)
    assert "only the prefork pool enforces soft and hard time limits" in message
    assert "--pool prefork" in message
    assert isinstance(info.value, UnstuckError)


@pytest.mark.parametrize("pool", ["threads", "solo", "gevent", "eventlet"])
def test_refusal_names_the_pool_given_by_name(pool: str) -> None:
    with pytest.raises(WorkerConfigError, match=f"'{pool}' pool"):
        check_pool(pool)


@pytest.mark.parametrize(("pool", "named"), [(ThreadPool, "thread"), (SoloPool, "solo")])
def test_refusal_names_the_pool_given_as_a_class(pool: type, named: str) -> None:
    with pytest.raises(WorkerConfigError) as info:
        check_pool(pool)
    assert named in str(info.value)
    assert "taskpool" not in str(info.value)
