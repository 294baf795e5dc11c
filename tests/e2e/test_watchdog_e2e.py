"""The watchdog with real worker and beat processes (interval 1 s) on a private redis-server.

No gateway waits on these calls: they are registered and dispatched the way the gateway
does it, so every synthetic answer here comes from the beat-driven sweep.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from celery import Celery

from tests.harness import (
    Proc,
    base_env,
    registration_fields,
    send_by_hand,
    start_beat,
    start_watchdog,
    start_worker,
    wait_until,
)
from workers.celery_edge.app import create_app
from workers.celery_edge.names import INVOKE_TASK, SWEEP_TASK
from workers.core.models import CallJob, ToolCall
from workers.core.run_health import RunStatus
from workers.local.embedded_redis import EmbeddedRedis
from workers.settings import Settings
from workers.store.connection import connect
from workers.store.ledger import Ledger
from workers.store.sessions import SessionStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

INTERVAL_S = 1.0
STALLED_AFTER_S = 2.0
LEASE_TTL_S = 3.0


class _Hook(BaseHTTPRequestHandler):
    received: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.received.append(json.loads(body))  # type: ignore[attr-defined]
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    server.received = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/alerts", server.received  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def env(redis_server: EmbeddedRedis, webhook: tuple[str, list[dict[str, Any]]]) -> dict[str, str]:
    return base_env(
        redis_server.url,
        UNSTUCK_WATCHDOG__INTERVAL_S=str(INTERVAL_S),
        UNSTUCK_WATCHDOG__STALLED_AFTER_S=str(STALLED_AFTER_S),
        UNSTUCK_WATCHDOG__AUTO_RECOVER="true",
        UNSTUCK_WATCHDOG__WEBHOOK_URL=webhook[0],
    )


@pytest.fixture(scope="module")
def processes(env: dict[str, str]) -> Iterator[list[Proc]]:
    procs = [start_worker(env, concurrency=3, name="wd"), start_watchdog(env), start_beat(env)]
    yield procs
    for proc in procs:
        proc.kill()


@pytest.fixture(scope="module")
def settings(redis_server: EmbeddedRedis) -> Settings:
    return Settings(redis={"url": redis_server.url}, lease={"ttl_s": LEASE_TTL_S, "renew_interval_s": 0.5})


@pytest.fixture(scope="module")
def store(settings: Settings) -> Iterator[SessionStore]:
    client = connect(settings.redis.url, socket_timeout_s=5, socket_connect_timeout_s=2)
    yield SessionStore(Ledger(client, prefix="unstuck", ttl_s=3600, lease_ttl_ms=int(LEASE_TTL_S * 1000)))
    client.close()


@pytest.fixture(scope="module")
def app(settings: Settings) -> Iterator[Celery]:
    celery = create_app(settings, role="client")
    yield celery
    celery.close()


def now_ms() -> int:
    return int(time.time() * 1000)


def submit(
    app: Celery,
    store: SessionStore,
    session: str,
    run: str,
    call: ToolCall,
    *,
    deadline_s: float,
    soft_s: float = 30.0,
    queue: str = "unstuck.tools",
    send: bool = True,
) -> None:
    """Register and dispatch one call as workers/gateway.py does."""
    now = now_ms()
    keys = store.ledger.keys(session, run)
    job = CallJob(
        session_key=session,
        run_id=run,
        call=call,
        submitted_ms=now,
        deadline_ms=now + int(deadline_s * 1000),
        soft_s=soft_s,
        hard_s=soft_s + 5,
    )
    fields = {**registration_fields(job), "idempotent": "0"}
    assert store.ledger.register(keys, call.id, now_ms=now, deadline_ms=job.deadline_ms, fields=fields)
    task_id = f"{keys.due_member(call.id)}#0"
    if send:
        send_by_hand(
            app,
            INVOKE_TASK,
            kwargs={"job": job.model_dump(mode="json")},
            task_id=task_id,
            soft_time_limit=soft_s,
            time_limit=soft_s + 5,
            queue=queue,
        )
    store.ledger.mark_dispatched(keys, call.id, task_id)


def answered(store: SessionStore, session: str, run: str, call_id: str) -> bool:
    return bool(store.ledger.results(store.ledger.keys(session, run), [call_id]))


def _holds_lane(store: SessionStore, session_key: str, run_id: str, token: int) -> bool:
    """Whether ``run_id`` still holds its session's lane with ``token`` (the fencing check)."""
    lane = store.lane(session_key)
    return lane is not None and (lane.run_id, lane.token) == (run_id, token)


def test_worker_host_killed_is_answered_within_one_interval(
    env: dict[str, str], processes: list[Proc], app: Celery, store: SessionStore
) -> None:
    # Given a call running on a worker that only serves its own queue
    victim = start_worker({**env, "UNSTUCK_BROKER__QUEUE": "victim"}, concurrency=1, name="victim")
    try:
        submit(app, store, "kill-s", "r1", ToolCall(id="k1", name="slow", arguments={"seconds": 60}),
               deadline_s=60, queue="victim")  # fmt: skip
        keys = store.ledger.keys("kill-s", "r1")
        wait_until(lambda: (r := store.ledger.record(keys, "k1")) is not None and r.state.value == "running",
                   timeout_s=30, what="k1 running")  # fmt: skip
        # When the whole host dies (main process and pool children)
        killed_at = time.monotonic()
        os.killpg(victim.pid, signal.SIGKILL)
        # Then the watchdog answers once the lease lapses, within one sweep interval (+ slack)
        wait_until(lambda: answered(store, "kill-s", "r1", "k1"), timeout_s=30, what="k1 answered")
        took_s = time.monotonic() - killed_at
    finally:
        victim.kill()
    record = store.ledger.record(keys, "k1")
    assert record is not None
    assert record.result is not None
    assert record.result.reason == "worker_lost"
    assert record.fields["writer"].endswith("/watchdog")
    assert took_s <= LEASE_TTL_S + INTERVAL_S + 1.5, took_s


def test_run_past_its_deadline_is_aborted_and_its_lane_freed(
    processes: list[Proc], app: Celery, store: SessionStore
) -> None:
    # Given a run with a 2 s budget and a call that would take longer
    token = store.begin_run("late-s", "r1", "main", now_ms(), now_ms() + 2000)
    submit(
        app, store, "late-s", "r1", ToolCall(id="d1", name="slow", arguments={"seconds": 4}), deadline_s=30
    )
    # When / Then
    wait_until(lambda: store.lane("late-s") is None, timeout_s=15, what="lane freed")
    info = store.run("late-s", "r1")
    assert info is not None
    assert info.status == RunStatus.TIMED_OUT.value
    result = store.ledger.results(store.ledger.keys("late-s", "r1"), ["d1"])["d1"]
    assert result.reason == "deadline_exceeded"
    assert not _holds_lane(store, "late-s", "r1", token)


def test_stuck_session_is_alerted_and_recovered(
    processes: list[Proc], store: SessionStore, webhook: tuple[str, list[dict[str, Any]]]
) -> None:
    # Given a run marked running with nothing active (its gateway went away between turns)
    store.begin_run("stuck-s", "r1", "main", now_ms(), now_ms() + 600_000)
    _, received = webhook
    # When / Then: detected, alerted to the webhook, recovered (auto_recover is on)
    wait_until(lambda: any(a.get("session_key") == "stuck-s" for a in received), timeout_s=20, what="alert")
    alert = next(a for a in received if a.get("session_key") == "stuck-s")
    assert alert["kind"] == "session.stuck"
    wait_until(lambda: store.lane("stuck-s") is None, timeout_s=10, what="lane freed")
    info = store.run("stuck-s", "r1")
    assert info is not None
    assert (info.status, info.end_reason) == ("aborted", "cancelled")


def test_a_long_tool_that_heartbeats_is_never_stalled(
    processes: list[Proc], app: Celery, store: SessionStore, webhook: tuple[str, list[dict[str, Any]]]
) -> None:
    # Given a tool running three times longer than stalled_after_s, heartbeating all along
    store.begin_run("beat-s", "r1", "main", now_ms(), now_ms() + 600_000)
    call = ToolCall(id="b1", name="beating", arguments={"seconds": 6.5, "stop_beating_after": 99})
    submit(app, store, "beat-s", "r1", call, deadline_s=60, soft_s=20)
    keys = store.ledger.keys("beat-s", "r1")
    seen: set[str] = set()

    def finished() -> bool:
        klass = store.client.hget(keys.run, "class")
        if klass:
            seen.add(str(klass))
        return answered(store, "beat-s", "r1", "b1")

    # When it runs to the end while the watchdog sweeps every second
    wait_until(finished, timeout_s=30, interval_s=0.1, what="b1 finished")
    # Then it was seen, only ever as progressing, and never alerted or touched
    assert seen == {"long_running"}
    _, received = webhook
    assert not [a for a in received if a.get("session_key") == "beat-s"]
    result = store.ledger.results(keys, ["b1"])["b1"]
    assert result.text == "finished"


def test_two_beats_answer_each_overdue_call_once(
    env: dict[str, str], processes: list[Proc], app: Celery, store: SessionStore
) -> None:
    # Given a second beat, and calls that no worker will ever run
    second = start_beat(env)
    try:
        ids = [f"o{n}" for n in range(8)]
        for call_id in ids:
            submit(app, store, "two-s", "r1", ToolCall(id=call_id, name="noop"), deadline_s=1.5, send=False)
        # When their deadline passes
        wait_until(lambda: all(answered(store, "two-s", "r1", c) for c in ids), timeout_s=20, what="answers")
        wait_until(lambda: SWEEP_TASK in second.log(), timeout_s=10, what="second beat sent")
    finally:
        second.kill()
    # Then each got exactly one answer, written by a watchdog sweep
    keys = store.ledger.keys("two-s", "r1")
    for call_id in ids:
        record = store.ledger.record(keys, call_id)
        assert record is not None
        assert record.result is not None
        assert record.result.reason == "deadline_exceeded"
        assert record.fields["writer"].endswith("/watchdog")
        assert store.ledger.late_results(keys, call_id) == []
