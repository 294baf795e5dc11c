"""The scripted agent session of ``unstuck demo``: tools misbehave in every way, every call is answered.

The demo starts its own Redis (embedded unless ``UNSTUCK_REDIS__URL`` is set), worker and
beat on a private queue, runs four turns, prints one row per call and the invariant line,
and stops everything. Turns:

1. healthy calls, a tool that raises, R1 (SIGSEGV and OOM-style SIGKILL of the pool
   child), R2 (a hang that ignores the soft limit) and R5 (invalid arguments, unknown tool);
2. R3: a gateway in a subprocess is SIGKILLed mid-call; a new gateway's ``collect`` gets it;
3. R4: the worker main process is SIGKILLed mid-call; ``worker_lost`` within the lease TTL;
4. healthy calls on the restarted worker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from workers.core.models import ToolCall, ToolResult
from workers.errors import ConfigError, UnstuckError
from workers.local.demo_report import Row, check_invariant, render_table, report_json
from workers.local.up import Interrupted, Stack, StackOptions, StartupError, stop_on_signals
from workers.runtime import build_runtime
from workers.settings import Settings, load_settings
from workers.store.ledger import Ledger
from workers.store.records import CallField

__all__ = ["Demo", "DemoGateway", "GatewaySide", "demo_overrides", "run_demo"]

LEASE_TTL_S = 3.0
_WAIT_RUNNING_S = 30.0
_EXIT_FAILED = 1
_EXIT_STARTUP = 2


def demo_overrides(token: str) -> dict[str, Any]:
    """Settings of the demo: its tools, short leases and limits, and a private queue."""
    return {
        "tool_modules": ("workers.local.demo_tools",),
        "lease": {"ttl_s": LEASE_TTL_S, "renew_interval_s": 0.5},
        # R2's call queues behind R1's two dying children. A dead child is reaped on SIGCHLD
        # (celery_edge/child_exits.py); before that, a CI run (2026-12-06) had one found by
        # Celery's 5 s upkeep, and the call passed a 3 s allowance and never ran. The margin
        # stays for a loaded machine, where forking the replacements takes its time too.
        "limits": {"queue_allowance_s": 8.0, "hard_grace_s": 1.0},
        "watchdog": {"interval_s": 2.0},
        "broker": {"queue": f"unstuck.demo.{token}", "control_queue": f"unstuck.demo.{token}.control"},
    }


def _as_env(overrides: dict[str, Any], prefix: str = "UNSTUCK_") -> dict[str, str]:
    env: dict[str, str] = {}
    for key, value in overrides.items():
        name = f"{prefix}{key.upper()}"
        if isinstance(value, dict):
            env.update(_as_env(value, f"{name}__"))
        else:
            env[name] = ",".join(value) if isinstance(value, tuple) else str(value)
    return env


class DemoGateway(Protocol):
    """What the demo uses of :class:`workers.gateway.client.ToolGateway`."""

    def call_tools(self, *, session_key: str, run_id: str, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Run ``calls`` and return one result per call."""
        ...

    def collect(self, session_key: str, run_id: str) -> list[ToolResult]:
        """Results of every call of the run."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


@dataclass(frozen=True)
class GatewaySide:
    """How the demo reaches the gateway, wired by the CLI so that ``workers.local`` never imports it.

    ``make`` builds a gateway; ``child_argv`` starts a process that submits one call through a
    gateway of its own and waits for it, given the session key, run id and call JSON as
    three more arguments (R3 SIGKILLs that process).
    """

    make: Callable[[Settings], DemoGateway]
    child_argv: tuple[str, ...]


def _call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def _turn1() -> list[Row]:
    return [
        Row("healthy", "healthy", "ok", _call("t1-weather", "lookup_weather", city="Lisbon")),
        Row("healthy", "healthy", "ok", _call("t1-search", "search_docs", query="celery time limits")),
        Row("error", "tool raises", "tool_error", _call("t1-flaky", "flaky_api")),
        Row("R1", "R1 crash (SIGSEGV)", "crashed", _call("t1-segv", "segfault")),
        Row("R1", "R1 OOM-style SIGKILL", "crashed", _call("t1-oom", "oom_kill")),
        Row("R2", "R2 hang, ignores soft limit", "timeout_hard", _call("t1-hang", "hang")),
        Row("R5", "R5 invalid arguments", "invalid_arguments", _call("t1-badargs", "add", a="three", b=4)),
        Row("R5", "R5 unknown tool", "unknown_tool", _call("t1-unknown", "serch_docs", query="x")),
    ]


class Demo:
    """Runs the turns against a started :class:`Stack` and keeps every delivered result."""

    def __init__(
        self, stack: Stack, settings: Settings, progress: Callable[[str], None], gateway: GatewaySide
    ) -> None:
        self.stack = stack
        self.settings = settings
        self.progress = progress
        self.session_key = f"demo-{uuid.uuid4().hex[:8]}"
        self.gateway_side = gateway
        self.gateway = gateway.make(settings)
        self.ledger: Ledger = build_runtime(settings).ledger
        self.rows: list[Row] = []
        self.delivered: list[ToolResult] = []

    def run(self) -> None:
        """All four turns, in order."""
        self.turn("t1", _turn1())
        self.gateway_restart()
        self.worker_killed()
        self.progress("turn 4: healthy calls on the restarted worker")
        self.turn(
            "t4",
            [
                Row(
                    "healthy",
                    "healthy after recovery",
                    "ok",
                    _call("t4-weather", "lookup_weather", city="Porto"),
                ),
                Row("healthy", "healthy after recovery", "ok", _call("t4-add", "add", a=2, b=3)),
            ],
        )

    def turn(self, run_id: str, rows: list[Row]) -> None:
        """One model turn: submit the rows' calls together and record what comes back."""
        if run_id == "t1":
            self.progress("turn 1: healthy calls, a raising tool, R1 crashes, R2 hang, R5 bad input")
        self.rows.extend(rows)
        results = self.gateway.call_tools(
            session_key=self.session_key, run_id=run_id, calls=[row.call for row in rows]
        )
        self._deliver(run_id, results)

    def gateway_restart(self) -> None:
        """R3: SIGKILL a gateway process mid-call, then ``collect`` from a new gateway."""
        run_id = "t2"
        row = Row("R3", "R3 gateway killed mid-call", "ok", _call("t2-report", "slow_report", seconds=3))
        row.via = "collect"
        self.rows.append(row)
        argv = [*self.gateway_side.child_argv, self.session_key, run_id, row.call.model_dump_json()]
        child = subprocess.Popen(argv, env=self.stack.child_env(), start_new_session=True)
        try:
            self._await_running(run_id, row.call.id, lambda: child.poll() is None)
            self.progress(f"R3: gateway pid {child.pid} has slow_report in flight; SIGKILL it")
            child.kill()
        finally:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=10)
        self.progress("R3: a new ToolGateway collects the run")
        fresh = self.gateway_side.make(self.settings)
        try:
            self._deliver(run_id, fresh.collect(self.session_key, run_id))
        finally:
            fresh.close()

    def worker_killed(self) -> None:
        """R4: SIGKILL the worker main process mid-call; the call is answered when its lease lapses."""
        run_id = "t3"
        row = Row("R4", "R4 worker main killed", "worker_lost", _call("t3-report", "slow_report", seconds=30))
        self.rows.append(row)
        box: list[list[ToolResult]] = []
        thread = threading.Thread(
            target=lambda: box.append(
                self.gateway.call_tools(session_key=self.session_key, run_id=run_id, calls=[row.call])
            ),
            daemon=True,
        )
        thread.start()
        worker = self.stack.worker
        assert worker is not None
        self._await_running(run_id, row.call.id, thread.is_alive)
        self.progress(f"R4: SIGKILL worker main pid {worker.pid} mid-call (lease TTL {LEASE_TTL_S:g}s)")
        worker.kill_main()
        replacement = self.stack.restart_worker()
        thread.join(timeout=row_deadline_s(self.settings) + 10)
        self._deliver(run_id, box[0] if box else [])
        self.progress(f"R4: answered; new worker pid {replacement.pid} starting")
        replacement.wait_for_log(" ready.", timeout_s=60)

    def _await_running(self, run_id: str, call_id: str, still_waiting: Callable[[], bool]) -> None:
        keys = self.ledger.keys(self.session_key, run_id)
        end = time.monotonic() + _WAIT_RUNNING_S
        while time.monotonic() < end and still_waiting():
            record = self.ledger.record(keys, call_id)
            if record is not None and record.state.value == "running":
                return
            time.sleep(0.05)
        raise UnstuckError(
            f"call {call_id} never started running; see the worker log in {self.stack.log_dir}"
        )

    def _deliver(self, run_id: str, results: list[ToolResult]) -> None:
        self.delivered.extend(results)
        keys = self.ledger.keys(self.session_key, run_id)
        by_id = {row.call.id: row for row in self.rows}
        for result in results:
            row = by_id.get(result.tool_call_id)
            if row is None:
                continue
            row.result = result
            record = self.ledger.record(keys, result.tool_call_id)
            if record is not None and CallField.FINISHED_MS in record.row:
                stored = record.row
                submitted = stored.integer(CallField.SUBMITTED_MS)
                row.latency_s = round((stored.integer(CallField.FINISHED_MS) - submitted) / 1000, 2)
                row.deadline_s = round((stored.integer(CallField.DEADLINE_MS) - submitted) / 1000, 2)
                row.grace_s = self.settings.gateway.grace_s


def row_deadline_s(settings: Settings) -> float:
    """Upper bound of the slowest demo call's deadline (the R4 call)."""
    return settings.limits.queue_allowance_s + 40.0 + settings.gateway.grace_s


def run_demo(*, json_output: bool, gateway: GatewaySide) -> int:
    """Run the whole demo; returns 0 when every call got exactly one result as expected."""
    started = time.monotonic()
    token = uuid.uuid4().hex[:8]
    overrides = demo_overrides(token)

    def progress(message: str) -> None:
        print(f"• {message}", file=sys.stderr, flush=True)

    try:
        base = load_settings(**overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return _EXIT_STARTUP
    options = StackOptions(node_name=f"demo-{token}@%h", env=_as_env(overrides), stop_timeout_s=5.0)
    stack = Stack(base, options)
    code = _EXIT_FAILED
    try:
        with stop_on_signals():
            code = _run(stack, gateway, progress, json_output, started)
    except Interrupted:
        print("interrupted; stopping", file=sys.stderr)
        code = 130
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = _EXIT_STARTUP
    except UnstuckError as exc:
        print(f"error: the demo could not finish: {exc}", file=sys.stderr)
        code = _EXIT_FAILED
    finally:
        stack.stop(remove_logs=code == 0)
        if code != 0:
            print(f"logs of the demo's processes: {stack.log_dir}", file=sys.stderr)
    return code


def _run(
    stack: Stack, gateway: GatewaySide, progress: Callable[[str], None], json_output: bool, started: float
) -> int:
    where = "embedded" if not stack.settings.redis.url else "from UNSTUCK_REDIS__URL"
    progress(f"starting Redis ({where}), a prefork worker, the watchdog and beat")
    stack.start()
    info = stack.describe()
    progress(f"Redis {info['redis_url']}, worker pid {info['worker_pid']}, beat pid {info['beat_pid']}")
    demo = Demo(stack, stack.settings, progress, gateway)
    try:
        demo.run()
    finally:
        demo.gateway.close()
    invariant = check_invariant([row.call.id for row in demo.rows], demo.delivered)
    runtime_s = round(time.monotonic() - started, 1)
    if json_output:
        report = report_json(demo.rows, invariant, runtime_s=runtime_s, processes=stack.describe())
        print(json.dumps(report, indent=2))
    else:
        print(render_table(demo.rows, invariant))
        print(f"(session {demo.session_key}, {runtime_s}s)")
    ok = invariant.holds and all(row.as_expected for row in demo.rows)
    return 0 if ok else _EXIT_FAILED
