"""The worker and the gateway on a Sentinel list follow the primary through a failover.

A real topology on loopback (tests/sentinel_harness.py): calls are answered through the
first primary, the primary is SIGKILLed, the Sentinels promote the replica, and calls keep
being answered, now through the new primary, without restarting anything.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import kombu
import pytest
import redis
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.sentinel import SentinelConnectionPool

from tests.harness import GatewayOn, WorkerOn, base_env, recorded_runs, settings_of, wait_until
from tests.sentinel_harness import LocalSentinels
from workers import ToolCall, ToolGateway, ToolResult
from workers.celery_edge.app_config import celery_config
from workers.settings import Settings
from workers.store.connection import connect
from workers.store.duplicates import duplicate_count


def _call(run: str, text: str) -> ToolCall:
    return ToolCall(id=f"{run}-c", name="echo", arguments={"text": text})


def _echo(gateway: ToolGateway, run: str, text: str) -> list[ToolResult]:
    return gateway.call_tools(session_key="s1", run_id=run, calls=[_call(run, text)])


def _keys_on(port: int) -> int:
    client = redis.Redis(port=port, socket_timeout=1)
    try:
        return int(client.dbsize())
    finally:
        client.close()


def _answering(sentinels: LocalSentinels, worker_on: WorkerOn, gateway_on: GatewayOn) -> ToolGateway:
    """A worker and a gateway on the Sentinel list; one call answered through the first primary."""
    env = base_env(sentinels.url, UNSTUCK_REDIS__SENTINEL_MASTER=sentinels.master)
    worker_on(env)
    gateway = gateway_on(env)
    assert [(r.text, r.is_error) for r in _echo(gateway, "before", "one")] == [("one", False)]
    return gateway


@pytest.mark.timeout(120)
def test_calls_are_answered_through_the_new_primary_after_a_failover(
    sentinels: LocalSentinels, worker_on: WorkerOn, gateway_on: GatewayOn
) -> None:
    # Given a worker and a gateway on the Sentinel list, answering through the first primary
    gateway = _answering(sentinels, worker_on, gateway_on)
    # When the primary dies and the Sentinels promote its replica
    sentinels.kill_primary()
    killed = time.monotonic()
    sentinels.await_promotion()
    promoted_s = time.monotonic() - killed
    # Then calls are answered again, through the new primary, by the same worker and gateway
    after = [_echo(gateway, f"after{i}", f"t{i}") for i in range(5)]
    answered_s = time.monotonic() - killed
    assert [[(r.text, r.is_error) for r in results] for results in after] == [
        [(f"t{i}", False)] for i in range(5)
    ]
    assert _keys_on(sentinels.replica.port) > 0
    print(f"promotion {promoted_s:.1f}s after the kill; five calls answered {answered_s:.1f}s after it")


@pytest.mark.timeout(120)
def test_a_worker_leaves_a_silent_primary_for_the_promoted_replica(
    sentinels: LocalSentinels, worker_on: WorkerOn, gateway_on: GatewayOn
) -> None:
    # Given a worker and a gateway on the Sentinel list, answering through the first primary
    gateway = _answering(sentinels, worker_on, gateway_on)
    # When the primary stops answering without closing a connection (SIGSTOP: the worker's
    # BRPOP on it gets no reply, as behind a partition) and the Sentinels promote the replica
    sentinels.primary_stopped(True)
    try:
        stopped = time.monotonic()
        sentinels.await_promotion()
        after = _echo(gateway, "after", "two")
        answered_s = time.monotonic() - stopped
        still_stopped = sentinels.primary.process is not None and _stopped(sentinels.primary.process.pid)
    finally:
        sentinels.primary_stopped(False)
    # Then the worker ran the call through the new primary while the old one was still silent,
    # well before kombu's default check (a reply 1 + 25 s overdue) would have dropped its BRPOP
    assert [(r.text, r.is_error) for r in after] == [("two", False)]
    assert still_stopped
    assert answered_s < 15, f"answered {answered_s:.1f}s after the primary stopped"
    print(f"call answered {answered_s:.1f}s after the primary stopped")


@pytest.mark.timeout(120)
def test_a_primary_resumed_after_its_replica_was_promoted_is_left_before_it_is_demoted(
    sentinels: LocalSentinels, worker_on: WorkerOn, gateway_on: GatewayOn
) -> None:
    calls = 5
    # Given a worker and a gateway on the Sentinel list, answering through the first primary
    gateway = _answering(sentinels, worker_on, gateway_on)
    # When the primary stops, its replica is promoted and the old primary resumes: it answers
    # as a primary (BRPOPs, writes) until the Sentinels demote it, seconds later
    _resume_after_promotion(sentinels)
    resumed = time.monotonic()
    # Then calls are answered through the new primary while the old one is still a primary: no
    # worker waits on its empty queue, and no call is published to it to be lost at the demotion
    after = [_echo(gateway, f"after{i}", f"t{i}") for i in range(calls)]
    answered_s = time.monotonic() - resumed
    still_primary = LocalSentinels.settled_primary(sentinels.primary)
    assert [[(r.text, r.is_error) for r in results] for results in after] == [
        [(f"t{i}", False)] for i in range(calls)
    ]
    assert still_primary, f"answered only after the old primary was demoted ({answered_s:.1f}s)"
    print(f"{calls} calls answered {answered_s:.1f}s after the old primary resumed, before its demotion")


def _resume_after_promotion(sentinels: LocalSentinels) -> None:
    """Stop the primary until the Sentinels promote its replica, then resume it (still a primary)."""
    sentinels.primary_stopped(True)
    try:
        sentinels.await_promotion()
    finally:
        sentinels.primary_stopped(False)


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("T")


def test_a_dead_sentinel_first_in_the_list_costs_no_wait(sentinels: LocalSentinels) -> None:
    # Given the store's client and a broker connection, both through the Sentinel list
    settings = Settings(redis={"url": sentinels.url, "sentinel_master": sentinels.master})
    access = settings.redis.sentinel_access()
    client = connect(sentinels.url, socket_timeout_s=2.0, socket_connect_timeout_s=1.0, sentinel=access)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    pool.get_master_address()  # type: ignore[no-untyped-call]
    options = celery_config(settings)["broker_transport_options"]
    broker = kombu.Connection(settings.broker_url, transport_options=options)
    # When the Sentinel each asks first is SIGKILLed (it answered last, so it leads the list)
    first = pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs["port"]
    next(s for s in sentinels.sentinels if s.port == first).kill()
    # Then both find the primary through the next Sentinel at once, where redis-py's default
    # retry spent 3 s of backoff on the dead one first
    started = time.monotonic()
    assert pool.get_master_address()[1] == sentinels.primary.port  # type: ignore[no-untyped-call]
    store_s = time.monotonic() - started
    started = time.monotonic()
    broker.ensure_connection(max_retries=1)
    broker_s = time.monotonic() - started
    broker.release()
    client.close()
    assert store_s < 1.0, f"store: {store_s:.2f}s"
    assert broker_s < 1.0, f"broker: {broker_s:.2f}s"


@dataclass
class _Handed:
    """What one agent was handed for one call: the checker's own history, kept outside Redis."""

    agent: str
    run: str
    result: ToolResult | None
    started: float
    done: float
    error: str = ""


def _agent(gateway: ToolGateway, name: str, stop: threading.Event, handed: list[_Handed]) -> None:
    n = 0
    while not stop.is_set():
        run = f"r{n}"
        call = ToolCall(id="c", name="record_attempt", arguments={"tag": f"{name}/{run}"})
        started = time.monotonic()
        try:
            [result] = gateway.call_tools(session_key=name, run_id=run, calls=[call])
            handed.append(_Handed(name, run, result, started, time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - any escape out of call_tools is a missing answer
            handed.append(_Handed(name, run, None, started, time.monotonic(), repr(exc)))
        n += 1


@pytest.mark.timeout(180)
def test_agents_under_load_lose_no_delivered_result_when_the_primary_dies(
    sentinels: LocalSentinels, worker_on: WorkerOn, gateway_on: GatewayOn, runs_file: Path
) -> None:
    # Given six agents calling a tool without pause through a worker on the Sentinel list,
    # each write waiting for the replica (redis.min_replica_acks unset: the primary has one)
    env = base_env(
        sentinels.url, UNSTUCK_REDIS__SENTINEL_MASTER=sentinels.master, RECORD_RUN_FILE=str(runs_file)
    )
    worker_on(env, concurrency=4)
    gateways = {f"agent{i}": gateway_on(env) for i in range(6)}
    stop = threading.Event()
    handed: list[_Handed] = []
    agents = [
        threading.Thread(target=_agent, args=(gw, name, stop, handed), daemon=True)
        for name, gw in gateways.items()
    ]
    for agent in agents:
        agent.start()
    wait_until(lambda: len(handed) >= 30, timeout_s=30, what="calls answered before the kill")
    # When the replica falls a second behind (SIGSTOPped, and 32 MB written before the agents'
    # writes fill the kernel's socket buffers, so the primary holds what follows), then the
    # primary is SIGKILLed under that load and the Sentinels promote the replica
    sentinels.replica_stopped(True)
    redis.Redis(port=sentinels.primary.port, socket_timeout=5).set("lag", b"x" * (32 << 20))
    time.sleep(1.0)  # the lag itself: writes made in this second exist on the primary only
    sentinels.kill_primary()
    killed = time.monotonic()
    sentinels.replica_stopped(False)
    sentinels.await_promotion()
    at_kill = len(handed)
    wait_until(lambda: len(handed) >= at_kill + 60, timeout_s=60, what="calls answered after the promotion")
    stop.set()
    for agent in agents:
        agent.join(timeout=60)
    # Then every call was handed exactly one result, none an exception out of call_tools
    assert [h.error for h in handed if h.result is None] == []
    # and what each agent was handed is what the new primary's ledger holds
    ledger = next(iter(gateways.values()))._rt.ledger
    differing = []
    for h in handed:
        assert h.result is not None
        stored = ledger.results(ledger.keys(h.agent, h.run), ["c"]).get("c")
        if stored != h.result:
            differing.append((h.agent, h.run, h.result.text, stored.text if stored else None))
    assert differing == []
    # and every second execution was counted (the runs file: one line per execution)
    executions = [line.split()[0] for line in recorded_runs(runs_file)]
    again = len(executions) - len(set(executions))
    assert duplicate_count(ledger.client, ledger.prefix) == again
    failed = sorted({h.result.details.get("reason", "") for h in handed if h.result and h.result.is_error})
    slowest = max(h.done - h.started for h in handed)
    first_new = min(h.done for h in handed if h.started > killed) - killed
    print(
        f"{len(handed)} calls, {sum(h.done < killed for h in handed)} answered before the kill,"
        f" {again} duplicate executions, error reasons {failed}, slowest call {slowest:.1f}s,"
        f" first call submitted after the kill answered {first_new:.1f}s after it"
    )


@pytest.mark.timeout(120)
def test_an_asyncio_pool_follows_a_resumed_old_primary_before_any_connection_breaks(
    sentinels: LocalSentinels,
) -> None:
    from workers.store.connection import aconnect
    from workers.store.primary_watch import _address

    async def scenario() -> tuple[tuple[str, int], tuple[str, int]]:
        # Given an asyncio client through the Sentinels, on the first primary
        client = aconnect(
            sentinels.url,
            socket_timeout_s=2.0,
            socket_connect_timeout_s=1.0,
            max_connections=4,
            sentinel=settings_of(
                base_env(sentinels.url, UNSTUCK_REDIS__SENTINEL_MASTER=sentinels.master)
            ).redis.sentinel_access(),
        )
        pool = cast(AsyncSentinelPool, client.connection_pool)
        try:
            await client.set("k", "1")
            before = _address(pool.master_address)
            # When the primary stops, its replica is promoted and the old primary resumes (it
            # answers as a primary until the Sentinels demote it, seconds later)
            await asyncio.to_thread(_resume_after_promotion, sentinels)
            # Then the pool names the promoted primary within a few checks of the watch, with
            # no command sent meanwhile (none fails to teach it)
            deadline = time.monotonic() + 3.0
            # The watch's coroutine sets the address and signals nothing: polled.
            while _address(pool.master_address) == before and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            return before, _address(pool.master_address)
        finally:
            await client.aclose()
            for sentinel in pool.sentinel_manager.sentinels:
                await sentinel.aclose()

    before, after = asyncio.run(scenario())
    assert before == ("127.0.0.1", sentinels.primary.port)
    assert after == ("127.0.0.1", sentinels.replica.port)
    assert LocalSentinels.settled_primary(sentinels.primary), "the old primary was demoted first"
