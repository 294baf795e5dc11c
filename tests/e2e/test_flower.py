"""Flower tells the truth: every call's task ends in the state of its outcome, with its reason.

Real processes on a private redis-server: a tool worker, a second worker that gets killed,
the watchdog and beat, and Flower behind basic auth (``unstuck flower``). The test makes
calls for every outcome a gateway, a worker or the watchdog can give, then reads Flower's
own API (``/api/tasks``) and renders its tasks page in headless Chromium on the "Failed"
filter. Only the Chromium check needs Chromium (Debian package ``chromium``).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.harness import (
    UNSTUCK,
    Proc,
    base_env,
    kill_pids,
    settings_of,
    start_beat,
    start_watchdog,
    start_worker,
    wait_until,
)
from workers.celery_edge.app import create_app
from workers.core.models import ToolCall, ToolResult
from workers.gateway.client import ToolGateway
from workers.gateway.dispatching import Dispatcher
from workers.local.embedded_redis import EmbeddedRedis
from workers.settings import Settings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

USER, PASSWORD = "operator", "flower-e2e-pw"
SESSION = "flower-e2e"
LOOPS = {"enabled": True, "historySize": 30, "warningThreshold": 3, "criticalThreshold": 5}
VICTIM_QUEUE = "unstuck.victim"
UNCONSUMED_QUEUE = "unstuck.nobody"


@dataclass(frozen=True)
class Expected:
    """What Flower must show for one call's task."""

    state: str
    reason: str | None
    exception: str | None = None  # the failure's class name
    answered_by: str | None = None  # how the worker field starts: who closed the task


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Flower:
    """Flower's HTTP API with basic auth."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self._auth = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

    def get(self, path: str, **query: str) -> Any:
        url = f"{self.base}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        request = urllib.request.Request(url, headers={"Authorization": self._auth})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def tasks(self, **query: str) -> dict[str, dict[str, Any]]:
        return dict(self.get("/api/tasks", **query))

    def status_without_auth(self) -> int:
        try:
            with urllib.request.urlopen(f"{self.base}/api/tasks", timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code


def _task_id(run: str, call_id: str) -> str:
    return f"{SESSION}/{run}/{call_id}#0"


def _call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


@dataclass
class Stack:
    """The running processes and Flower's API."""

    env: dict[str, str]
    flower: Flower
    victim: Proc


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """Redis, a 7-slot worker, a victim worker, the watchdog, beat and Flower (basic auth)."""
    redis_server = EmbeddedRedis().start()
    env = base_env(
        redis_server.url,
        UNSTUCK_WATCHDOG__INTERVAL_S="1",
        UNSTUCK_TOOLS__DENY="noop",
        UNSTUCK_TOOLS__LOOP_DETECTION=json.dumps(LOOPS),
    )
    port = _free_port()
    procs: list[Proc] = []
    try:
        flower_env = {**env, "FLOWER_BASIC_AUTH": f"{USER}:{PASSWORD}"}
        procs.append(Proc([UNSTUCK, "flower", "--port", str(port)], flower_env, "flower"))
        procs[-1].wait_for_log("Visit me at", timeout_s=60)
        procs.append(start_worker(env, concurrency=7, name="main"))
        victim = start_worker({**env, "UNSTUCK_BROKER__QUEUE": VICTIM_QUEUE}, concurrency=1, name="victim")
        procs.extend([victim, start_watchdog(env), start_beat(env)])
        yield Stack(env, Flower(port), victim)
    finally:
        for proc in procs:
            strays = proc.children()
            proc.kill()
            kill_pids(strays)
        redis_server.close()


@pytest.fixture(scope="module")
def expected(stack: Stack) -> dict[str, Expected]:
    """Every outcome, made once for the module; returns what Flower must show per task id."""
    settings = settings_of(stack.env)
    gateway = ToolGateway(settings)
    try:
        _warm_up(gateway, stack.flower)
        expected = _submit_unconsumed(settings, gateway)  # answered by the watchdog meanwhile
        expected.update(_run_main_batch(gateway))
        expected.update(_run_loop(gateway))
        expected.update(_run_superseded(settings, gateway))
        expected.update(_run_worker_lost(settings, stack.victim))
    finally:
        gateway.close()
    wait_until(
        lambda: _states(stack.flower, expected) == {tid: e.state for tid, e in expected.items()},
        timeout_s=60,
        interval_s=0.25,
        what="Flower to show every call in its final state",
    )
    return expected


def _states(flower: Flower, expected: dict[str, Expected]) -> dict[str, str | None]:
    tasks = flower.tasks()
    return {tid: tasks.get(tid, {}).get("state") for tid in expected}


def _warm_up(gateway: ToolGateway, flower: Flower) -> None:
    """Flower may not listen to events yet: make healthy calls until it shows one."""
    for attempt in range(1, 31):
        call = _call(f"warm-{attempt}", "echo", text="hi")
        gateway.call_tools(session_key=SESSION, run_id="warm", calls=[call])
        task_id = _task_id("warm", call.id)
        try:
            wait_until(
                lambda: flower.tasks().get(task_id, {}).get("state") == "SUCCESS",  # noqa: B023 - used at once
                timeout_s=2,
                interval_s=0.1,
                what="Flower to show a warm-up call",
            )
            return
        except AssertionError:
            continue  # its events went out before Flower subscribed
    raise AssertionError("Flower never showed a warm-up call")


def _run_main_batch(gateway: ToolGateway) -> dict[str, Expected]:
    """One turn with every outcome a worker or the gateway's submission gives."""
    run = "run-main"
    calls = {
        "call-echo": (_call("call-echo", "echo", text="fine"), Expected("SUCCESS", None)),
        "call-boom": (
            _call("call-boom", "boom", message="disk full"),
            Expected("FAILURE", "tool_error", "ToolFailed"),
        ),
        "call-crash": (
            _call("call-crash", "crash", how="sigkill"),
            Expected("FAILURE", "crashed", "Crashed"),
        ),
        "call-oom": (
            _call("call-oom", "memory_hog", mb=3072),
            Expected("FAILURE", "out_of_memory", "OutOfMemory"),
        ),
        "call-sleepy": (
            _call("call-sleepy", "sleepy", seconds=10),
            Expected("FAILURE", "timeout_soft", "TimeoutSoft"),
        ),
        "call-stubborn": (
            _call("call-stubborn", "stubborn", seconds=10),
            Expected("FAILURE", "timeout_hard", "TimeoutHard"),
        ),
        "call-beating": (
            _call("call-beating", "beating", seconds=10, stop_beating_after=0.2),
            Expected("FAILURE", "heartbeat_timeout", "HeartbeatTimeout"),
        ),
        "call-fallback": (
            _call("call-fallback", "optional_lookup", seconds=10),
            Expected("FAILURE", "timeout_soft", "TimeoutSoft"),
        ),
        "call-badargs": (
            _call("call-badargs", "echo", nope=1),
            Expected("FAILURE", "invalid_arguments", "ArgumentsInvalid", "unstuck-gateway"),
        ),
        "call-unknown": (
            _call("call-unknown", "ehco", text="x"),
            Expected("FAILURE", "unknown_tool", "UnknownTool", "unstuck-gateway"),
        ),
        "call-denied": (
            _call("call-denied", "noop"),
            Expected("FAILURE", "tool_not_allowed", "ToolNotAllowed", "unstuck-gateway"),
        ),
    }
    results = gateway.call_tools(session_key=SESSION, run_id=run, calls=[call for call, _ in calls.values()])
    _assert_ledger_agrees(results, {cid: exp for cid, (_, exp) in calls.items()})
    return {_task_id(run, cid): exp for cid, (_, exp) in calls.items()}


def _assert_ledger_agrees(results: list[ToolResult], expected: dict[str, Expected]) -> None:
    # What the agent got is what Flower must show: a mismatch here is the test's setup, not Flower.
    assert {r.tool_call_id: r.reason for r in results} == {cid: e.reason for cid, e in expected.items()}


def _run_loop(gateway: ToolGateway) -> dict[str, Expected]:
    """The same failing call six times: warnings from the 4th, blocked at the 6th."""
    run = "run-loop"
    results = []
    for i in range(1, 7):
        call = _call(f"loop-{i}", "boom", message="same")
        results.extend(gateway.call_tools(session_key=SESSION, run_id=run, calls=[call]))
    assert [r.reason for r in results] == ["tool_error"] * 5 + ["loop_blocked"]
    expected = {
        _task_id(run, f"loop-{i}"): Expected("FAILURE", "tool_error", "ToolFailed") for i in range(1, 6)
    }
    expected[_task_id(run, "loop-6")] = Expected("FAILURE", "loop_blocked", "LoopBlocked", "unstuck-gateway")
    return expected


def _run_superseded(settings: Settings, gateway: ToolGateway) -> dict[str, Expected]:
    """A newer run of the session takes over: the older run's running call is answered ``cancelled``."""
    first = ToolGateway(settings)
    box: list[list[ToolResult]] = []
    call = _call("call-slow", "slow", seconds=6)
    thread = threading.Thread(
        target=lambda: box.append(first.call_tools(session_key="flower-sup", run_id="run-old", calls=[call]))
    )
    thread.start()
    ledger = gateway._rt.ledger
    keys = ledger.keys("flower-sup", "run-old")

    def running() -> bool:
        record = ledger.record(keys, call.id)
        return record is not None and record.state.value == "running"

    wait_until(running, timeout_s=30, what="the old run's call to run")
    newer = gateway.call_tools(
        session_key="flower-sup", run_id="run-new", calls=[_call("call-new", "echo", text="x")]
    )
    thread.join(timeout=30)
    first.close()
    assert [r.reason for r in box[0]] == ["cancelled"]
    assert [r.reason for r in newer] == [None]
    return {
        "flower-sup/run-old/call-slow#0": Expected("REVOKED", "cancelled", "Cancelled"),
        "flower-sup/run-new/call-new#0": Expected("SUCCESS", None),
    }


def _submit_unconsumed(settings: Settings, gateway: ToolGateway) -> dict[str, Expected]:
    """A call on a queue no worker reads, with no gateway waiting: the watchdog answers it at its deadline."""
    nobody = settings.model_copy(
        update={"broker": settings.broker.model_copy(update={"queue": UNCONSUMED_QUEUE})}
    )
    app = create_app(nobody, role="client")
    ledger = gateway._rt.ledger
    dispatcher = Dispatcher(nobody, ledger, app, "flower-e2e", lambda: int(time.time() * 1000))
    keys = ledger.keys(SESSION, "run-wd")
    submission = dispatcher.plan(
        keys, "main", _call("call-queued", "sleepy", seconds=1), int(time.time() * 1000), None
    )
    job = submission.job
    registration = ledger.register_call(
        keys,
        job.call.id,
        now_ms=job.submitted_ms,
        deadline_ms=job.deadline_ms,
        fields=submission.fields,
        push=submission.push,
    )
    dispatcher.sent(submission, registration)
    assert registration.created
    app.close()
    return {
        _task_id("run-wd", "call-queued"): Expected(
            "FAILURE", "deadline_exceeded", "DeadlineExceeded", "unstuck-watchdog"
        )
    }


def _run_worker_lost(settings: Settings, victim: Proc) -> dict[str, Expected]:
    """The victim worker's main process dies mid-call: the gateway answers ``worker_lost``."""
    on_victim = settings.model_copy(
        update={"broker": settings.broker.model_copy(update={"queue": VICTIM_QUEUE})}
    )
    gateway = ToolGateway(on_victim)
    box: list[list[ToolResult]] = []
    call = _call("call-lost", "slow", seconds=30)
    thread = threading.Thread(
        target=lambda: box.append(gateway.call_tools(session_key=SESSION, run_id="run-lost", calls=[call]))
    )
    thread.start()
    ledger = gateway._rt.ledger
    keys = ledger.keys(SESSION, "run-lost")

    def running() -> bool:
        record = ledger.record(keys, call.id)
        return record is not None and record.state.value == "running"

    wait_until(running, timeout_s=30, what="the victim's call to run")
    strays = victim.children()
    victim.kill_hard()
    kill_pids(strays)
    thread.join(timeout=30)
    gateway.close()
    assert [r.reason for r in box[0]] == ["worker_lost"]
    return {_task_id("run-lost", "call-lost"): Expected("FAILURE", "worker_lost", "WorkerLost", "unstuck-")}


# -- the checks ------------------------------------------------------------------------------


def test_flower_api_shows_each_call_in_the_state_of_its_outcome_with_its_reason(
    stack: Stack, expected: dict[str, Expected]
) -> None:
    tasks = stack.flower.tasks()
    for task_id, want in expected.items():
        task = tasks[task_id]
        # Then the task is named after the call's tool, session and run
        session, run, _ = task_id.split("/")
        assert task["name"].endswith(f" [{session}/{run}]"), (task_id, task["name"])
        # And the state is the outcome's, and the result names the reason
        assert task["state"] == want.state, (task_id, task)
        assert f"'reason': {want.reason!r}" in task["result"], (task_id, task["result"])
        if want.exception is None:
            assert task["exception"] in (None, ""), (task_id, task)
        else:
            # And the exception's type names the reason, its message the reason and the text
            assert task["exception"].startswith(f"{want.exception}("), (task_id, task["exception"])
            assert want.reason in task["exception"]
            assert "Traceback" not in (task["traceback"] or ""), (task_id, task["traceback"])
        if want.answered_by is not None:
            assert task["worker"].startswith(want.answered_by), (task_id, task["worker"])
    # And no call's task is left waiting: every task of a call ended
    ours = {tid: t for tid, t in tasks.items() if "#" in tid}
    assert not [tid for tid, t in ours.items() if t["state"] not in ("SUCCESS", "FAILURE", "REVOKED")]
    # And only a tool's own success is SUCCESS
    assert {tid for tid, t in ours.items() if t["state"] == "SUCCESS"} == {
        tid for tid in ours if tid.startswith(f"{SESSION}/warm/")
    } | {tid for tid, e in expected.items() if e.state == "SUCCESS"}


def test_loop_warnings_are_shown_with_the_warned_calls(stack: Stack, expected: dict[str, Expected]) -> None:
    tasks = stack.flower.tasks()
    warned = [_task_id("run-loop", f"loop-{i}") for i in (4, 5)]
    for task_id in warned:
        # The warning rides in the task's kwargs and comes back in its outcome info
        assert "loop_warning" in tasks[task_id]["kwargs"]
        assert "'loop_warning': {'detector': 'generic_repeat'" in tasks[task_id]["result"]
    assert "loop_warning" not in tasks[_task_id("run-loop", "loop-1")]["result"]


@pytest.mark.parametrize(
    ("query", "run_and_calls"),
    [
        ("timeout_hard", [("run-main", "call-stubborn")]),
        ("result:heartbeat_timeout", [("run-main", "call-beating")]),
        ("unknown_tool", [("run-main", "call-unknown")]),
        ("call-fallback", [("run-main", "call-fallback")]),
        ("stubborn", [("run-main", "call-stubborn")]),
        ("run-loop", [("run-loop", f"loop-{i}") for i in range(1, 7)]),
    ],
)
def test_flower_search_finds_calls_by_reason_call_id_tool_and_run(
    stack: Stack, expected: dict[str, Expected], query: str, run_and_calls: list[tuple[str, str]]
) -> None:
    found = set(stack.flower.tasks(search=query))
    assert found == {_task_id(run, call_id) for run, call_id in run_and_calls}


def test_flower_search_finds_a_session(stack: Stack, expected: dict[str, Expected]) -> None:
    found = set(stack.flower.tasks(search="flower-sup"))
    assert found == {tid for tid in expected if tid.startswith("flower-sup/")}


def test_flower_requires_its_basic_auth(stack: Stack) -> None:
    assert stack.flower.status_without_auth() == 401


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium (Debian package `chromium`)")
def test_failed_filter_of_flowers_tasks_page_lists_the_failed_calls(
    stack: Stack, expected: dict[str, Expected]
) -> None:
    assert CHROMIUM is not None
    failed = {tid for tid, e in expected.items() if e.state == "FAILURE"}
    url = stack.flower.base.replace("://", f"://{USER}:{PASSWORD}@") + "/tasks?state=FAILURE"
    # The rows arrive by an AJAX call after load: the virtual time budget lets it finish.
    dom = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=10000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    rows = dict(re.findall(r'<tr id="([^"]+)"[^>]*>(.*?)</tr>', dom, flags=re.S))
    # Then the page shows failed calls only, each with its FAILURE badge and reason
    assert rows, dom[-2000:]
    assert set(rows) <= failed
    for task_id, html in rows.items():
        assert ">FAILURE</span>" in html, task_id
        assert str(expected[task_id].reason) in html, task_id
    # And the table counts every failed call (it shows the first page of them)
    shown = re.search(r"Showing 1 to (\d+) of (\d+) tasks", dom)
    assert shown is not None, dom[-2000:]
    assert (int(shown.group(1)), int(shown.group(2))) == (len(rows), len(failed))
