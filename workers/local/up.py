"""Run the whole system on one machine: Redis (given or embedded), a worker, the watchdog, beat, Flower.

Every child runs in its own process group (its own session), so stopping it reaches its
pool children too: SIGTERM to the group, then SIGKILL after a timeout. The embedded
redis-server is stopped last. ``unstuck up`` and ``unstuck demo`` both use :class:`Stack`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from workers.cli.launch import beat_argv, flower_argv, preflight, watchdog_argv, worker_argv
from workers.errors import ConfigError, StoreError, UnstuckError
from workers.local.embedded_redis import EmbeddedRedis
from workers.settings import Settings, process_environment

__all__ = [
    "Child",
    "Interrupted",
    "Stack",
    "StackOptions",
    "StartupError",
    "child_env",
    "default_state_file",
    "port_in_use",
    "remove_state",
    "stop_on_signals",
    "write_state",
]

_PR_SET_PDEATHSIG = 1


class StartupError(UnstuckError):
    """Raised when the local system cannot start; the message is one sentence with the fix."""


class Interrupted(BaseException):
    """Raised in the main thread when SIGINT or SIGTERM asks us to stop."""


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into :class:`Interrupted` in the main thread while inside."""

    def _raise(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, _raise) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    # Clean-up must not be cut short by a second Ctrl-C, or children would be left behind.
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def child_env(extra: Mapping[str, str], *, keep_unstuck: bool = True) -> dict[str, str]:
    """Our environment plus ``extra``; ``keep_unstuck=False`` drops inherited ``UNSTUCK_*`` first."""
    env = {k: v for k, v in process_environment().items() if keep_unstuck or not k.startswith("UNSTUCK_")}
    env.update(extra)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def default_state_file() -> Path:
    """Where ``unstuck up`` writes its state: ``<tmp>/unstuck-<uid>/up.json``."""
    return Path(tempfile.gettempdir()) / f"unstuck-{os.getuid()}" / "up.json"


def _die_with_parent() -> None:
    # Linux only: if `up` itself is SIGKILLed, its direct children are killed too.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Child:
    """A child process in its own process group, its output in a log file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def spawn(cls, name: str, argv: list[str], env: Mapping[str, str], log_dir: Path) -> Child:
        """Start ``argv`` in a new session with stdout and stderr going to ``log_dir/name.log``."""
        log_path = log_dir / f"{name}.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                argv,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        return cls(name, process, log_path)

    @property
    def pid(self) -> int:
        """Process id of the main process (also its process group id)."""
        return self.process.pid

    def alive(self) -> bool:
        """Whether the main process is still running."""
        return self.process.poll() is None

    def log_text(self) -> str:
        """Everything the process wrote so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for_log(self, text: str, *, timeout_s: float) -> None:
        """Block until ``text`` appears in the log; raises ``StartupError`` on exit or timeout."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if text in self.log_text():
                return
            if not self.alive():
                raise StartupError(
                    f"the {self.name} exited at start (code {self.process.returncode}); "
                    f"see {self.log_path} for why"
                )
            time.sleep(0.05)
        raise StartupError(f"the {self.name} did not become ready within {timeout_s:g}s; see {self.log_path}")

    def kill_main(self) -> None:
        """SIGKILL the main process only, as if its host died under it (its pool is left orphaned)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self, timeout_s: float) -> None:
        """SIGTERM the whole process group, SIGKILL it after ``timeout_s``, and reap the main process."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout_s)
        # Also reaches pool children that outlived their main process.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)


def port_in_use(port: int) -> bool:
    """Whether something already listens on loopback ``port``."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class StackOptions:
    """What to start, and how."""

    redis_port: int | None = None
    flower_port: int | None = None
    serve_port: int | None = None
    concurrency: int | None = None
    loglevel: str = "INFO"
    node_name: str = "unstuck@%h"
    env: dict[str, str] = field(default_factory=dict)
    keep_unstuck_env: bool = True
    stop_timeout_s: float = 10.0
    ready_timeout_s: float = 60.0


class Stack:
    """Redis, one tool worker, the watchdog, beat and optionally Flower, started and stopped together."""

    def __init__(self, settings: Settings, options: StackOptions, *, log_dir: Path | None = None) -> None:
        self.options = options
        self.settings = settings
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="unstuck-up-"))
        self.embedded: EmbeddedRedis | None = None
        self.worker: Child | None = None
        self.watchdog: Child | None = None
        self.beat: Child | None = None
        self.flower: Child | None = None
        self.serve: Child | None = None
        # One worker per stateful MCP upstream: the one pool child that runs its calls.
        self.upstream_workers: list[Child] = []
        self._retired: list[Child] = []

    @property
    def redis_url(self) -> str:
        """The Redis every process uses."""
        return self.settings.redis.url

    @property
    def flower_url(self) -> str | None:
        """Flower's address when it runs."""
        return f"http://127.0.0.1:{self.options.flower_port}" if self.flower else None

    def children(self) -> list[Child]:
        """Running (or exited but not yet stopped) children: worker, watchdog, beat, Flower."""
        children = (self.worker, self.watchdog, self.beat, self.flower, self.serve, *self.upstream_workers)
        return [c for c in children if c is not None]

    def start(self) -> Stack:
        """Start everything; raises ``StartupError`` (one sentence with the fix) on failure."""
        self._start_redis()
        self._preflight()
        self.worker = self._spawn_worker()
        self.upstream_workers = [
            self._spawn_upstream_worker(name)
            for name, upstream in self.settings.mcp.upstreams().items()
            if upstream.unstuck.stateful
        ]
        self.watchdog = Child.spawn("watchdog", self._watchdog_argv(), self.child_env(), self.log_dir)
        self.beat = Child.spawn("beat", self._beat_argv(), self.child_env(), self.log_dir)
        if self.options.flower_port is not None:
            self.flower = self._spawn_flower(self.options.flower_port)
        if self.options.serve_port is not None:
            self.serve = self._spawn_serve(self.options.serve_port)
        for worker in (self.worker, *self.upstream_workers):
            worker.wait_for_log(" ready.", timeout_s=self.options.ready_timeout_s)
        self.watchdog.wait_for_log(" ready.", timeout_s=self.options.ready_timeout_s)
        self.beat.wait_for_log("beat: Starting", timeout_s=self.options.ready_timeout_s)
        if self.flower is not None:
            self.flower.wait_for_log("Visit me at", timeout_s=self.options.ready_timeout_s)
        if self.serve is not None:
            self.serve.wait_for_log("Uvicorn running on", timeout_s=self.options.ready_timeout_s)
        return self

    def restart_worker(self) -> Child:
        """Start a new worker (the old one is stopped with the rest); does not wait for readiness."""
        if self.worker is not None:
            self._retired.append(self.worker)
        self.worker = self._spawn_worker(suffix=f"-{len(self._retired) + 1}")
        return self.worker

    def stop(self, *, remove_logs: bool = False) -> None:
        """Stop every child and the embedded Redis; safe to call twice."""
        with _signals_ignored():
            for child in [*self.children(), *self._retired]:
                child.stop(self.options.stop_timeout_s)
            self.worker = self.watchdog = self.beat = self.flower = self.serve = None
            self.upstream_workers = []
            self._retired = []
            if self.embedded is not None:
                self.embedded.close()
                self.embedded = None
            if remove_logs or not any(self.log_dir.glob("*.log")):
                shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> Stack:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- start-up steps ---------------------------------------------------------------------

    def _start_redis(self) -> None:
        if self.settings.redis.url:
            return
        port = self.options.redis_port
        if port is not None and port_in_use(port):
            raise StartupError(
                f"port {port} is already in use, so the embedded Redis cannot listen there; "
                "pick another with --redis-port or leave it out to use a free port"
            )
        try:
            self.embedded = EmbeddedRedis(port=port).start()
        except StoreError as exc:
            raise StartupError(f"{exc}; set UNSTUCK_REDIS__URL to use an existing Redis instead") from None
        redis = self.settings.redis.model_copy(update={"url": self.embedded.url})
        self.settings = self.settings.model_copy(update={"redis": redis})
        self.options.env["UNSTUCK_REDIS__URL"] = self.embedded.url

    def _preflight(self) -> None:
        try:
            preflight(self.settings)
        except ConfigError as exc:
            where, why = exc.problems[0] if exc.problems else ("configuration", str(exc))
            raise StartupError(
                f"{where} cannot be imported ({why}); fix UNSTUCK_TOOL_MODULES "
                "(comma-separated importable modules) or install what they need"
            ) from None
        except StoreError as exc:
            raise StartupError(str(exc)) from None
        serve = self.options.serve_port
        if serve is not None and port_in_use(serve):
            raise StartupError(
                f"port {serve} is already in use; pick another API port with --serve-port, or --no-serve"
            )
        flower = self.options.flower_port
        if flower is not None and port_in_use(flower):
            raise StartupError(
                f"port {flower} is already in use; pick another Flower port with --flower-port"
            )

    def child_env(self) -> dict[str, str]:
        """The environment every child of this stack gets."""
        return child_env(self.options.env, keep_unstuck=self.options.keep_unstuck_env)

    def _spawn_worker(self, suffix: str = "") -> Child:
        argv = worker_argv(
            self.settings,
            concurrency=self.options.concurrency,
            hostname=self.options.node_name,
            loglevel=self.options.loglevel,
        )
        return Child.spawn(f"worker{suffix}", argv, self.child_env(), self.log_dir)

    def _spawn_upstream_worker(self, upstream: str) -> Child:
        argv = worker_argv(
            self.settings,
            concurrency=1,
            hostname=f"mcp-{upstream}-{self.options.node_name}",
            loglevel=self.options.loglevel,
            upstream=upstream,
        )
        return Child.spawn(f"worker-mcp-{upstream}", argv, self.child_env(), self.log_dir)

    def _watchdog_argv(self) -> list[str]:
        # The tool worker's node name with a watchdog- prefix: unique per stack, so two stacks
        # on one host never share a node name.
        name = f"watchdog-{self.options.node_name}"
        return watchdog_argv(self.settings, hostname=name, loglevel=self.options.loglevel)

    def _beat_argv(self) -> list[str]:
        return beat_argv(loglevel=self.options.loglevel, schedule_file=str(self.log_dir / "beat-schedule"))

    def _spawn_serve(self, port: int) -> Child:
        argv = [sys.executable, "-m", "workers.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port)]
        return Child.spawn("serve", argv, self.child_env(), self.log_dir)

    def _spawn_flower(self, port: int) -> Child:
        return Child.spawn("flower", flower_argv(port, "127.0.0.1"), self.child_env(), self.log_dir)

    def describe(self) -> dict[str, Any]:
        """What runs where, for the start-up banner and the state file."""
        return {
            "redis_url": self.redis_url,
            "redis_embedded": self.embedded is not None,
            "redis_pid": self.embedded.process.pid if self.embedded and self.embedded.process else None,
            "worker_pid": self.worker.pid if self.worker else None,
            "retired_worker_pids": [child.pid for child in self._retired],
            "node_name": self.options.node_name,
            "watchdog_pid": self.watchdog.pid if self.watchdog else None,
            "beat_pid": self.beat.pid if self.beat else None,
            "flower_url": self.flower_url,
            "api_url": f"http://127.0.0.1:{self.options.serve_port}" if self.serve else None,
            "logs": str(self.log_dir),
            "up_pid": os.getpid(),
        }


def write_state(path: Path, state: Mapping[str, Any]) -> None:
    """Write the state file atomically (other commands read the Redis URL from it)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def remove_state(path: Path) -> None:
    """Remove the state file if it is ours (best effort)."""
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text(encoding="utf-8")).get("up_pid") == os.getpid():
            path.unlink()
