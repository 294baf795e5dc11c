"""The watchdog's tasks travel on their own queue, and each process registers only its own tasks."""

from __future__ import annotations

import subprocess
import sys

from celery import Celery

import workers.celery_edge.app
from beat_schedule import build_beat_schedule
from workers.celery_edge.app import celery_config, create_app
from workers.celery_edge.names import HOUSEKEEPING_TASK, INVOKE_TASK, SWEEP_TASK
from workers.cli.launch import watchdog_argv, worker_argv
from workers.settings import Settings

SETTINGS = Settings(redis={"url": "redis://127.0.0.1:1/0"})


def _queue_of(app: Celery, task_name: str) -> str:
    route = app.amqp.router.route({}, task_name)
    return str(route["queue"].name)


def test_sweeps_and_housekeeping_go_to_the_control_queue_and_calls_to_the_tool_queue() -> None:
    # Given the client app the gateway and beat use
    app = create_app(SETTINGS, role="client")
    # Then the watchdog's tasks and the tool calls never share a queue
    assert _queue_of(app, SWEEP_TASK) == "unstuck.control"
    assert _queue_of(app, HOUSEKEEPING_TASK) == "unstuck.control"
    assert _queue_of(app, INVOKE_TASK) == "unstuck.tools"
    assert set(build_beat_schedule(SETTINGS)) == {"unstuck-watchdog", "unstuck-housekeeping"}


def test_only_the_watchdog_and_beat_load_the_beat_schedule() -> None:
    # Given the app of each role
    apps = {role: create_app(SETTINGS, role=role) for role in ("client", "worker", "control")}
    # Then only the control app (the watchdog and beat run it) has the schedule
    assert set(apps["control"].conf.beat_schedule) == {"unstuck-watchdog", "unstuck-housekeeping"}
    assert not apps["client"].conf.beat_schedule
    assert not apps["worker"].conf.beat_schedule


def test_a_tool_worker_listens_to_the_tool_queue_only_and_the_watchdog_to_the_control_queue_only() -> None:
    worker = worker_argv(SETTINGS, concurrency=2, hostname="w@h", loglevel="INFO")
    watchdog = watchdog_argv(SETTINGS, hostname="wd@h", loglevel="INFO")
    assert worker[worker.index("--queues") + 1] == "unstuck.tools"
    assert watchdog[watchdog.index("--queues") + 1] == "unstuck.control"
    assert "workers.celery_edge.app:control_app" in watchdog


def test_each_role_registers_only_its_own_tasks() -> None:
    # When each process's app (`-A workers.celery_edge.app` and `-A workers.celery_edge.app:control_app`)
    # loads its task modules, as `celery worker` does at start-up, in one interpreter
    registered = {}
    for attribute in ("app", "control_app"):
        app = getattr(workers.celery_edge.app, attribute)
        app.loader.import_default_modules()
        registered[attribute] = {name for name in app.tasks if name.startswith("unstuck.")}
    # Then a tool worker cannot run a sweep and the watchdog cannot run a tool
    assert registered["app"] == {INVOKE_TASK}
    assert registered["control_app"] == {SWEEP_TASK, HOUSEKEEPING_TASK}


def test_a_sweep_is_stopped_while_it_still_holds_the_sweep_lock() -> None:
    annotations = celery_config(SETTINGS)["task_annotations"]
    lock_s = SETTINGS.watchdog.sweep_lock_ttl_s
    for name in (SWEEP_TASK, HOUSEKEEPING_TASK):
        assert annotations[name]["soft_time_limit"] < annotations[name]["time_limit"] < lock_s


def test_sending_clients_and_tool_workers_never_import_the_beat_schedule() -> None:
    # Given a fresh interpreter that builds the gateway's and a tool worker's apps
    code = (
        "import sys\n"
        "from workers.celery_edge.app import create_app\n"
        "from workers.gateway.client import ToolGateway\n"
        "from workers.settings import Settings\n"
        "s = Settings(redis={'url': 'redis://127.0.0.1:1/0'})\n"
        "create_app(s, role='client'); create_app(s, role='worker')\n"
        "print('beat_schedule' in sys.modules)\n"
    )
    argv = [sys.executable, "-c", code]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    # Then the root beat_schedule module was never loaded
    assert done.stdout.strip() == "False", done.stderr[-2000:]
