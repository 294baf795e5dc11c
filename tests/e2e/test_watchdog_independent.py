"""The watchdog runs in its own process on its own queue: nothing it watches can starve it.

Real processes on a private redis-server: one tool worker, ``unstuck watchdog`` (the only
consumer of the control queue) and beat, sweeping every second.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import time
from collections.abc import Iterator

import pytest

from tests.harness import (
    Proc,
    base_env,
    settings_in_env,
    start_beat,
    start_watchdog,
    start_worker,
    wait_until,
)
from workers.celery_edge.names import SWEEP_TASK
from workers.core.run_health import RunStatus
from workers.gateway.client import ToolGateway
from workers.local.embedded_redis import EmbeddedRedis
from workers.settings import Settings
from workers.store.sessions import SessionStore
from workers.store.watchdog_liveness import WatchdogLiveness

pytestmark = [pytest.mark.slow]

INTERVAL_S = 1.0
RUN_BUDGET_S = 5.0
# How long every pool slot stays hung: 30 s (30 sweeps) in make test; UNSTUCK_HUNG_FOR_S=120 holds
# them for the two minutes an operator's worst case is usually quoted at.
HUNG_FOR_S = float(os.environ.get("UNSTUCK_HUNG_FOR_S", "30"))

# An agent process: one run, one long call; it blocks in call_tools until it is killed.
AGENT = """
import sys
from workers import ToolCall, ToolGateway
ToolGateway().call_tools(
    session_key=sys.argv[1], run_id=sys.argv[2],
    calls=[ToolCall(id="c1", name="slow", arguments={"seconds": 60})],
)
"""


@pytest.fixture
def redis_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    yield server
    server.close()


@pytest.fixture
def env(redis_server: EmbeddedRedis, request: pytest.FixtureRequest) -> dict[str, str]:
    # A run budget of 5 s, except where a test's calls must outlive it.
    budget = request.node.get_closest_marker("run_budget_s")
    return base_env(
        redis_server.url,
        UNSTUCK_WATCHDOG__INTERVAL_S=str(INTERVAL_S),
        UNSTUCK_AGENTS__DEFAULTS__RUN_TIMEOUT_S=str(budget.args[0] if budget else RUN_BUDGET_S),
    )


@pytest.fixture
def settings(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    return settings_in_env(env, monkeypatch)


@pytest.fixture
def started() -> Iterator[list[Proc]]:
    procs: list[Proc] = []
    yield procs
    for proc in procs:
        proc.stop()


def _store(settings: Settings) -> SessionStore:
    return SessionStore(ToolGateway(settings)._rt.ledger)


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.timeout(120)
def test_agent_and_every_tool_worker_killed_the_watchdog_alone_answers(
    env: dict[str, str], settings: Settings, started: list[Proc]
) -> None:
    # Given a tool worker, the watchdog, beat and an agent process whose call is running
    worker = start_worker(env, concurrency=1, name="only")
    watchdog, beat = start_watchdog(env), start_beat(env)
    started.extend([worker, watchdog, beat])
    agent = Proc([sys.executable, "-c", AGENT, "lonely", "r1"], env, "agent")
    started.append(agent)
    store = _store(settings)
    keys = store.ledger.keys("lonely", "r1")
    wait_until(
        lambda: (r := store.ledger.record(keys, "c1")) is not None and r.state.value == "running",
        timeout_s=30,
        what="c1 running",
    )
    # When the agent process and every tool worker (main and pool children) are SIGKILLed
    os.killpg(agent.pid, signal.SIGKILL)
    os.killpg(worker.pid, signal.SIGKILL)
    wait_until(lambda: _dead(agent.pid) or agent.process.poll() is not None, timeout_s=5, what="agent dead")
    assert worker.process.wait(timeout=5) == -signal.SIGKILL

    # Then, with only the watchdog and beat alive, the ledger answers the call and ends the run
    def settled() -> bool:
        info = store.run("lonely", "r1")
        return bool(store.ledger.results(keys, ["c1"])) and info is not None and info.status != "running"

    wait_until(settled, timeout_s=RUN_BUDGET_S + 20, interval_s=0.05, what="call answered, run ended")
    seen_ms = int(time.time() * 1000)
    info = store.run("lonely", "r1")
    assert info is not None
    assert info.status in {RunStatus.TIMED_OUT.value, RunStatus.ABORTED.value}
    # ... no later than the run's deadline + one sweep interval + 2 s (observed, so an upper bound)
    print(f"answered and ended {seen_ms - info.deadline_ms:+d} ms after the run deadline")
    assert seen_ms <= info.deadline_ms + int(INTERVAL_S * 1000) + 2000, seen_ms - info.deadline_ms
    record = store.ledger.record(keys, "c1")
    assert record is not None
    assert record.result is not None
    assert record.result.reason in {"worker_lost", "deadline_exceeded"}
    assert record.fields["writer"].endswith("/watchdog")
    assert f"{SWEEP_TASK}[" in watchdog.log()
    assert watchdog.process.poll() is None
    assert beat.process.poll() is None


@pytest.mark.run_budget_s(HUNG_FOR_S * 3)
@pytest.mark.timeout(HUNG_FOR_S + 90)
def test_sweeps_keep_their_interval_while_every_pool_slot_is_hung(
    env: dict[str, str], settings: Settings, started: list[Proc]
) -> None:
    # Given every pool slot of the only tool worker held by a tool that ignores its limits,
    # and more calls queued behind them
    worker = start_worker(env, concurrency=2, name="hogged")
    started.extend([worker, start_watchdog(env), start_beat(env)])
    store = _store(settings)
    liveness = WatchdogLiveness(store.ledger)
    call_ids = [f"h{n}" for n in range(6)]
    started.append(Proc([sys.executable, "-c", _HOGS, "hogged", "r1", str(len(call_ids))], env, "hogs"))
    keys = store.ledger.keys("hogged", "r1")

    def running() -> int:
        records = [store.ledger.record(keys, call_id) for call_id in call_ids]
        return sum(1 for r in records if r is not None and r.state.value == "running")

    wait_until(lambda: running() == 2, timeout_s=30, what="both pool slots hung")
    # When the slots stay hung for the whole window
    sweeps_ms: list[int] = []
    end = time.monotonic() + HUNG_FOR_S
    while time.monotonic() < end:
        record = liveness.last()
        if record is not None and (not sweeps_ms or record.last_sweep_ms != sweeps_ms[-1]):
            sweeps_ms.append(record.last_sweep_ms)
        time.sleep(0.05)
    # Then the pool stayed hung, and the sweeps kept their interval throughout
    assert running() == 2
    gaps_ms = [b - a for a, b in itertools.pairwise(sweeps_ms)]
    print(f"{len(gaps_ms)} gaps between sweeps while hung: max {max(gaps_ms)} ms, min {min(gaps_ms)} ms")
    assert len(gaps_ms) >= HUNG_FOR_S / INTERVAL_S * 0.8, len(gaps_ms)
    assert max(gaps_ms) <= int((INTERVAL_S + 1) * 1000), max(gaps_ms)


STREAMER = """
import sys, time
from workers import ToolGateway, idle_guard

def tokens(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.2)
        yield "tok"

gateway = ToolGateway()
session, run, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
if seconds > 0:
    for _ in idle_guard(tokens(seconds), 5.0, gateway=gateway, session_key=session, run_id=run):
        pass
else:
    gateway.heartbeat(session, run)  # one turn begins, then nothing more
print("done", flush=True)
"""

STALLED_AFTER_S = 2.0
STREAM_FOR_S = 5 * STALLED_AFTER_S  # "five minutes" of streaming, on accelerated thresholds


@pytest.mark.run_budget_s(120)
@pytest.mark.timeout(90)
def test_a_streaming_agent_is_never_stalled_or_stuck_and_a_silent_one_is(
    env: dict[str, str], settings: Settings, started: list[Proc]
) -> None:
    # Given the watchdog with a 2 s stalled threshold, and two agents that never call a tool:
    # one streams a model answer for five thresholds, the other begins its turn and goes silent
    env = {**env, "UNSTUCK_WATCHDOG__STALLED_AFTER_S": str(STALLED_AFTER_S)}
    started.extend([start_watchdog(env), start_beat(env)])
    streamer = Proc([sys.executable, "-c", STREAMER, "streams", "r1", str(STREAM_FOR_S)], env, "streamer")
    silent = Proc([sys.executable, "-c", STREAMER, "silent", "r1", "0"], env, "silent")
    started.extend([streamer, silent])
    store = _store(settings)
    classes: dict[str, set[str]] = {"streams": set(), "silent": set()}

    def observe() -> bool:
        for session in classes:
            info = store.run(session, "r1")
            if info is not None and info.klass:
                classes[session].add(info.klass)
        return "done" in streamer.log()

    # When the stream runs to its end while the watchdog sweeps every second
    wait_until(observe, timeout_s=STREAM_FOR_S + 30, interval_s=0.1, what="stream finished")
    # Then the streaming run was never stalled or stuck, and the silent one was found stuck
    assert not classes["streams"] & {"stalled", "stuck"}, classes
    assert "stuck" in classes["silent"], classes
    info = store.run("streams", "r1")
    assert info is not None
    assert info.agent_beat_what == "model stream"


_HOGS = """
import sys
from workers import ToolCall, ToolGateway
session, run, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
ToolGateway().call_tools(
    session_key=session, run_id=run,
    calls=[ToolCall(id=f"h{n}", name="hog", arguments={"seconds": 300}) for n in range(count)],
)
"""
