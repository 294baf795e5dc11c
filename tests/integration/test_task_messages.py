"""Messages the async gateway pushes itself: what ``send_task`` would push, and workers run them.

See :mod:`workers.celery_edge.messages`: the message is built by Celery's ``as_task_v2`` and
wrapped as kombu's Redis transport wraps it, then pushed with one ``LPUSH`` from the event
loop. Compared here with the message ``send_task`` leaves on a real Redis for the same
options, and run by a real worker with ``send_task`` made unusable.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from tests.harness import Proc
from workers.celery_edge.app_config import configured_app
from workers.celery_edge.messages import TaskMessages, fast_publish_possible
from workers.celery_edge.names import INVOKE_TASK
from workers.core.models import ToolCall
from workers.core.run_health import RunStatus
from workers.gateway.client import ToolGateway
from workers.settings import Settings
from workers.store.keys import broker_queue_key
from workers.store.ledger import Ledger, Registration
from workers.store.sessions import SessionStore


def _decoded(raw: bytes | str) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(raw)
    message["body"] = json.loads(base64.b64decode(message["body"]))
    return message


def test_the_message_is_the_one_send_task_pushes(settings: Settings) -> None:
    if not fast_publish_possible(settings):
        pytest.skip("the broker is not the ledger's single Redis: the thread path publishes")
    app = configured_app(settings, include=[], set_as_current=False)
    client = redis.Redis.from_url(settings.broker_url)
    queue = settings.broker.queue
    now = datetime.now(tz=UTC)
    kwargs = {"job": {"call": {"id": "c1", "name": "echo", "arguments": {"text": "héllo"}}}}
    try:
        app.send_task(
            INVOKE_TASK,
            kwargs=kwargs,
            task_id="t-1",
            soft_time_limit=1.5,  # type: ignore[arg-type]
            time_limit=2.5,  # type: ignore[arg-type]
            queue=queue,
            shadow="echo s/r",
            ignore_result=True,
        )
        [theirs] = client.lrange(broker_queue_key(queue), 0, -1)
        mine = TaskMessages(app, queue).build(
            INVOKE_TASK,
            task_id="t-1",
            kwargs=kwargs,
            soft_s=1.5,
            hard_s=2.5,
            shadow="echo s/r",
            now=now,
        )
    finally:
        client.close()
    ours, celerys = _decoded(mine.payload), _decoded(theirs)
    # A fresh uuid per message either way. Neither carries Celery's expiry (see messages.py).
    for message in (ours, celerys):
        assert message["properties"].pop("delivery_tag")
    assert ours["headers"]["expires"] is None
    assert ours == celerys
    assert mine.queue == queue


def test_signed_messages_keep_celerys_publish(settings: Settings) -> None:
    signed = settings.model_copy(
        update={
            "broker": settings.broker.model_copy(
                update={"signing": settings.broker.signing.model_copy(update={"key_file": "key.pem"})}
            )
        }
    )
    assert not fast_publish_possible(signed)


@pytest.mark.timeout(60)
async def test_a_worker_runs_calls_published_from_the_loop(
    worker: Proc, agateway: ToolGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not fast_publish_possible(agateway.settings):
        pytest.skip("the broker is not the ledger's single Redis: the thread path publishes")

    def no_send_task(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the loop's submission must not go through send_task")

    monkeypatch.setattr(agateway._app, "send_task", no_send_task)
    for n in range(3):  # the first opens the run (on the pool), the others find it cached
        call = ToolCall(id=f"c{n}", name="echo", arguments={"text": f"hi {n}"})
        [result] = await agateway.acall_tools(session_key="fast", run_id="r1", calls=[call])
        assert result.text == f"hi {n}", result
    record = agateway._rt.ledger.record(agateway._rt.ledger.keys("fast", "r1"), "c2")
    assert record is not None
    assert record.result is not None
    assert record.result.text == "hi 2"


def test_the_register_script_pushes_only_a_new_call_of_a_running_run(ledger: Ledger) -> None:
    # Registration and publication are one step: a resubmitted id or a call of an ended run
    # leaves no message behind (a worker would only refuse it).
    client = ledger.client
    queue = broker_queue_key("q.test")
    keys = ledger.keys("s", "r1")
    sessions = SessionStore(ledger)
    sessions.begin_run("s", "r1", "main", now_ms=1_000, deadline_ms=60_000)

    def register(call_id: str) -> Registration:
        push = (queue, f"message of {call_id}")
        fields = {"tool": "echo", "dispatched": "1"}
        return ledger.register_call(keys, call_id, now_ms=2_000, deadline_ms=9_000, fields=fields, push=push)

    assert register("c1").created
    assert not register("c1").created  # the same id again: registered once, pushed once
    assert client.lrange(queue, 0, -1) == ["message of c1"]
    assert sessions.end_run("s", "r1", RunStatus.COMPLETED, now_ms=3_000)
    assert register("c2").refused
    assert client.lrange(queue, 0, -1) == ["message of c1"]
    assert ledger.record(keys, "c2") is None


@pytest.mark.timeout(60)
def test_a_worker_runs_calls_the_sync_gateway_registered_and_published_in_one_step(
    worker: Proc, gateway: ToolGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not fast_publish_possible(gateway.settings):
        pytest.skip("the broker is not the ledger's single Redis: send_task publishes")

    def no_send_task(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a first dispatch must ride in the register script, not send_task")

    monkeypatch.setattr(gateway._app, "send_task", no_send_task)
    calls = [ToolCall(id=f"c{n}", name="echo", arguments={"text": f"hi {n}"}) for n in range(3)]
    results = gateway.call_tools(session_key="fast-sync", run_id="r1", calls=calls)
    assert [r.text for r in results] == ["hi 0", "hi 1", "hi 2"], results
