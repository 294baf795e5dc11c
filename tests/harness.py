"""Real processes for integration/e2e tests and benchmarks: redis-server, worker, beat.

Readiness is awaited by watching logs or pinging, never by fixed sleeps.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import redis

from workers.core.job_digest import job_digest
from workers.core.models import CallJob
from workers.errors import StoreError
from workers.local.embedded_redis import EmbeddedRedis
from workers.settings import Settings
from workers.store.connection import connect

if TYPE_CHECKING:
    import pytest
    from celery import Celery

    from workers.core.models import ToolCall, ToolResult
    from workers.gateway.client import ToolGateway

REPO = Path(__file__).resolve().parent.parent
UNSTUCK = str(Path(sys.executable).parent / "unstuck")


def wait_until(
    predicate: Callable[[], bool], *, timeout_s: float, interval_s: float = 0.02, what: str = ""
) -> None:
    """Poll ``predicate`` until true; raise AssertionError after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}")


def base_env(redis_url: str, **extra: str) -> dict[str, str]:
    """Environment for unstuck processes in tests: our Redis, the misbehaving tools, short leases."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNSTUCK_")}
    env.update(
        {
            "UNSTUCK_REDIS__URL": redis_url,
            "UNSTUCK_TOOL_MODULES": "tests.misbehaving_tools",
            "UNSTUCK_LEASE__TTL_S": "3",
            "UNSTUCK_LEASE__RENEW_INTERVAL_S": "0.5",
            "UNSTUCK_LIMITS__QUEUE_ALLOWANCE_S": "3",
            "UNSTUCK_LIMITS__HARD_GRACE_S": "1",
            # Tests read how a task ended from Celery's line for it (task_outcome), which the
            # shipped settings leave out of the log.
            "UNSTUCK_WORKER__LOG_EACH_TASK": "true",
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if redis_url in _CLUSTER_BROKERS:  # the store on the cluster, Celery on its single Redis
        env["UNSTUCK_REDIS__CLUSTER"] = "true"
        env["UNSTUCK_BROKER__URL"] = _CLUSTER_BROKERS[redis_url]
    env.update(extra)
    return env


def registration_fields(job: CallJob) -> dict[str, str]:
    """The call-record fields a gateway registers for ``job``, for tests that publish by hand.

    A worker runs a message only when its call was registered with the message's tool and
    job digest, as the gateway's dispatcher does.
    """
    return {
        "tool": job.call.name,
        "agent_id": job.agent_id,
        "job": job.model_dump_json(),
        "job_digest": job_digest(job.model_dump(mode="json")),
    }


def send_by_hand(app: Celery, name: str, **options: Any) -> None:
    """``app.send_task`` for a test that publishes a message itself, asking for no result.

    The gateway's dispatcher never asks for one. A result asked for subscribes the app's Redis
    result backend on a connection nobody closes; its socket is collected in whatever test
    runs then, and the ResourceWarning fails that test (``filterwarnings = error``).
    """
    app.send_task(name, ignore_result=True, **options)


_OUTCOME_MARKS = (" succeeded in ", " raised expected", " reject requeue=", " ignored")


def task_outcome(log: str, task_id: str) -> str | None:
    """How an invoke task ended, from a worker's log; None while it has not.

    ``reported``: it reported its call's stored answer (Celery's succeeded or raised expected);
    ``ignored``; or, for a message the worker refused to run, the refusal (``unregistered``,
    ``mismatch``, ``mismatch_held``, ``unreadable``).
    """
    for line in log.splitlines():
        if f"[{task_id}]" not in line or not any(mark in line for mark in _OUTCOME_MARKS):
            continue
        if " reject requeue=" in line:
            refusal = line.split("refused: ", 1)[-1].strip()
            return "unreadable" if refusal.startswith("not a call") else refusal
        return "ignored" if " ignored" in line else "reported"
    return None


def recorded_runs(runs_file: Path) -> list[str]:
    """The tags ``record_run`` wrote to ``runs_file``, one per execution (none if it never ran)."""
    return runs_file.read_text().splitlines() if runs_file.exists() else []


def call_in_thread(
    gateway: ToolGateway, session: str, call: ToolCall
) -> tuple[threading.Thread, list[ToolResult]]:
    """Submit ``call`` (run "r") on a thread of its own; the thread, and the list its results fill."""
    results: list[ToolResult] = []

    def run() -> None:
        results.extend(gateway.call_tools(session_key=session, run_id="r", calls=[call]))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, results


def settings_of(env: dict[str, str]) -> Settings:
    """The settings ``env``'s processes read, built here without leaving ``env`` in os.environ."""
    previous = {k: v for k, v in os.environ.items() if k.startswith("UNSTUCK_")}
    for key in previous:
        del os.environ[key]
    os.environ.update({k: v for k, v in env.items() if k.startswith("UNSTUCK_")})
    try:
        return Settings()
    finally:
        for key in [k for k in os.environ if k.startswith("UNSTUCK_")]:
            del os.environ[key]
        os.environ.update(previous)


def settings_in_env(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings ``env``'s processes read, for this test process (its UNSTUCK_ vars replaced)."""
    for key in [k for k in os.environ if k.startswith("UNSTUCK_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith("UNSTUCK_"):
            monkeypatch.setenv(key, value)
    return Settings()


class Proc:
    """A child process whose combined output goes to a log file we can search."""

    def __init__(self, argv: list[str], env: dict[str, str], name: str) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix=f"unstuck-{name}-", suffix=".log")[1])
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            argv, env=env, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout_s: float = 30.0) -> None:
        def seen() -> bool:
            if self.process.poll() is not None and text not in self.log():
                raise AssertionError(f"process exited ({self.process.returncode}):\n{self.log()[-3000:]}")
            return text in self.log()

        wait_until(seen, timeout_s=timeout_s, interval_s=0.05, what=f"{text!r} in {self.log_path}")

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.pid)], capture_output=True, text=True, check=False)
        return [int(p) for p in out.stdout.split()]

    def kill_hard(self) -> None:
        """SIGKILL the main process only (like a host dying under it)."""
        os.kill(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def kill(self) -> None:
        """Teardown: SIGKILL the whole process group (pool children too) and reap it.

        A warm shutdown takes a worker 1-2 s (longer while a hung tool still runs), and a
        test's teardown has nothing to wait for: the next test flushes Redis, and what a dead
        worker leaves in its memory cgroup the next worker's start removes. A test that checks
        a graceful stop calls :meth:`stop`.
        """
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self._log.close()

    def stop(self, timeout_s: float = 15.0) -> None:
        """Terminate the whole process group and reap it (a warm shutdown)."""
        if self.process.poll() is None:
            os.killpg(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(timeout=5)
        self._log.close()


def start_worker(env: dict[str, str], *, concurrency: int = 2, name: str = "w1") -> Proc:
    """Start ``unstuck worker`` and wait until Celery reports it ready."""
    proc = Proc(
        [UNSTUCK, "worker", "-c", str(concurrency), "-n", f"{name}@%h", "-l", "INFO"], env, f"worker-{name}"
    )
    proc.wait_for_log(" ready.", timeout_s=60)
    return proc


# What the integration fixtures ``worker_on`` and ``gateway_on`` hand a test: a worker
# (``start_worker``'s options) or a gateway on the env given, stopped or closed after the test.
WorkerOn = Callable[..., "Proc"]
GatewayOn = Callable[[dict[str, str]], "ToolGateway"]


def start_watchdog(env: dict[str, str], *, name: str = "wd") -> Proc:
    """Start ``unstuck watchdog`` (the control-queue consumer) and wait until it is ready."""
    proc = Proc([UNSTUCK, "watchdog", "-n", f"watchdog-{name}@%h", "-l", "INFO"], env, f"watchdog-{name}")
    proc.wait_for_log(" ready.", timeout_s=60)
    return proc


def start_beat(env: dict[str, str]) -> Proc:
    """Start ``unstuck beat`` and wait until it is scheduling."""
    proc = Proc([UNSTUCK, "beat", "-l", "INFO"], env, "beat")
    proc.wait_for_log("beat: Starting", timeout_s=60)
    return proc


def processes_with_cmdline(fragment: str) -> list[int]:
    """Pids whose command line contains ``fragment`` (excluding this process)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):  # gone: skipped; unreadable: None
        if process.pid != os.getpid() and fragment in " ".join(process.info["cmdline"] or []):
            found.append(process.pid)
    return found


def kill_pids(pids: list[int]) -> None:
    """SIGKILL each pid that still exists (orphaned pool children of a killed worker)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# --- Redis Cluster --------------------------------------------------------------------------

#: Set (to ``cluster``) for the matrix leg that runs the store suites on a Redis Cluster.
CLUSTER_LEG = os.environ.get("UNSTUCK_TEST_REDIS", "") == "cluster"
#: Set by .ci/run: a cluster that cannot start fails the leg instead of skipping it.
CLUSTER_REQUIRED = os.environ.get("UNSTUCK_REQUIRE_CLUSTER", "") == "1"
# Cluster URL -> the single Redis its processes use as Celery broker (kombu cannot use a cluster).
_CLUSTER_BROKERS: dict[str, str] = {}


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cluster_port() -> int:
    """A free loopback port whose cluster bus port (+10000) is a valid, free port too."""
    for _ in range(1000):
        port = random.randint(20_000, 55_000)
        if _port_free(port) and _port_free(port + 10_000):
            return port
    raise StoreError("no free port pair (port, port + 10000) for a cluster node")


class LocalCluster:
    """A Redis Cluster of ``masters`` real redis-servers on free loopback ports, ``replicas`` each.

    Built as an operator would: each node started with ``--cluster-enabled yes``, the slots
    assigned by ``redis-cli --cluster create``, then awaited until every node reports
    ``cluster_state:ok`` with all 16384 slots assigned.
    """

    def __init__(
        self, masters: int = 3, *, replicas: int = 0, node_timeout_ms: int = 15000, appendonly: bool = False
    ) -> None:
        self.masters, self.replicas, self.node_timeout_ms = masters, replicas, node_timeout_ms
        args = ("--cluster-enabled", "yes", "--cluster-node-timeout", str(node_timeout_ms))
        self.nodes = [
            EmbeddedRedis(port=_cluster_port(), appendonly=appendonly, extra_args=args)
            for _ in range(masters * (1 + replicas))
        ]

    @property
    def url(self) -> str:
        """A node's URL: a cluster client finds the others from it."""
        return self.nodes[0].url

    def start(self, timeout_s: float = 30.0) -> LocalCluster:
        """Start the nodes, assign the slots and wait for ``cluster_state:ok``; raises on failure."""
        try:
            for node in self.nodes:
                node.start()
            cli = shutil.which("redis-cli")
            if cli is None:
                raise StoreError("redis-cli not found: it creates the test cluster (apt install redis-tools)")
            create = [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes)]
            subprocess.run(
                [*create, "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                check=True,
                capture_output=True,
                timeout=timeout_s,
            )
            wait_until(
                self._ready, timeout_s=timeout_s, interval_s=0.1, what="cluster_state:ok on every node"
            )
        except BaseException:
            self.close()
            raise
        return self

    def _ready(self) -> bool:
        return self.healthy(self.nodes) and (not self.replicas or self.replicas_linked())

    @staticmethod
    def healthy(nodes: list[EmbeddedRedis]) -> bool:
        """Every node of ``nodes`` reports ``cluster_state:ok`` with all 16384 slots assigned."""
        for node in nodes:
            client = redis.Redis(port=node.port, decode_responses=True, socket_timeout=1)
            try:
                info = client.cluster("info")
            except redis.RedisError:
                return False
            finally:
                client.close()
            if info.get("cluster_state") != "ok" or int(info.get("cluster_slots_assigned", 0)) != 16384:
                return False
        return True

    def roles(self) -> dict[int, str]:
        """Port -> ``master``, ``slave`` (linked up to its primary), ``syncing`` or ``down``."""
        found: dict[int, str] = {}
        for node in self.nodes:
            client = redis.Redis(port=node.port, decode_responses=True, socket_timeout=1)
            try:
                info = client.info("replication")
            except redis.RedisError:
                found[node.port] = "down"
                continue
            finally:
                client.close()
            role = str(info.get("role"))
            found[node.port] = (
                role if role == "master" or info.get("master_link_status") == "up" else "syncing"
            )
        return found

    def replicas_linked(self) -> bool:
        """``masters`` primaries, and every other node a replica linked up to its primary.

        Linked from both ends: a replica reports its link up once it loaded the primary's
        data, but the primary lists it ``online`` (and counts it in a WAIT, and in the
        INFO a ledger decides its WAIT from) only after the replica's first ACK.
        """
        roles = list(self.roles().values())
        replicas = len(self.nodes) - self.masters
        return (
            roles.count("master") == self.masters
            and roles.count("slave") == replicas
            and self.replicas_online() == replicas
        )

    def replicas_online(self) -> int:
        """How many replicas the primaries list as ``online``, from the primaries' side."""
        online = 0
        for node in self.nodes:
            client = redis.Redis(port=node.port, socket_timeout=1)
            try:
                info = client.info("replication")
            except redis.RedisError:
                continue
            finally:
                client.close()
            if info.get("role") == "master":
                listed = [v for k, v in info.items() if re.fullmatch(r"slave\d+", str(k))]
                online += sum(1 for v in listed if isinstance(v, dict) and v.get("state") == "online")
        return online

    def flush(self) -> None:
        """Empty every node (each master holds its own share of the keys)."""
        for node in self.nodes:
            client = redis.Redis(port=node.port)
            try:
                client.flushall()
            finally:
                client.close()

    def close(self) -> None:
        """Stop every node."""
        for node in self.nodes:
            node.close()


def register_cluster(cluster_url: str, broker_url: str) -> None:
    """Make :func:`base_env` and :func:`store_client` treat ``cluster_url`` as a cluster."""
    _CLUSTER_BROKERS[cluster_url] = broker_url


def is_cluster(redis_url: str) -> bool:
    """Whether ``redis_url`` is a test cluster's (registered by :func:`register_cluster`)."""
    return redis_url in _CLUSTER_BROKERS


def store_client(redis_url: str, *, timeout_s: float = 2.0) -> redis.Redis:
    """The store's own client for ``redis_url``: a cluster client on the cluster leg."""
    return connect(
        redis_url, socket_timeout_s=timeout_s, socket_connect_timeout_s=1, cluster=is_cluster(redis_url)
    )
