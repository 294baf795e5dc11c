"""A Sentinel-managed Redis on loopback for tests: one primary, one replica (or more), three Sentinels.

Every port comes from ``free_port()`` and every process has its own directory, so topologies
of parallel test processes never meet. Readiness and failover are awaited as conditions
(what the Sentinels report), never as fixed sleeps. Short ``down-after-milliseconds`` and
``failover-timeout`` make a promotion take about two seconds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import redis

from tests.harness import wait_until
from workers.local.embedded_redis import EmbeddedRedis, find_redis_server, free_port

__all__ = ["DOWN_AFTER_MS", "FAILOVER_TIMEOUT_MS", "LocalSentinels"]

MASTER_NAME = "unstuck-primary"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1, decode_responses=True)


def _role(port: int) -> tuple[str, int]:
    """(role, 1 when it is in sync: a primary with a replica online, a replica linked up)."""
    client = _client(port)
    try:
        info = client.info("replication")
    except redis.RedisError:
        return ("down", 0)
    finally:
        client.close()
    role = str(info.get("role"))
    if role == "master":
        listed = [value for key, value in info.items() if str(key).startswith("slave")]
        online = [r for r in listed if isinstance(r, dict) and r.get("state") == "online"]
        return (role, int(bool(online) and len(online) == int(info.get("connected_slaves", 0))))
    return (role, int(info.get("master_link_status") == "up"))


class _Sentinel:
    """One ``redis-server --sentinel`` watching the primary, with its own writable config."""

    def __init__(self, primary_port: int, master: str) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="unstuck-sentinel-")
        self.config = Path(self.dir) / "sentinel.conf"
        self.config.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            f"dir {self.dir}\n"
            f"sentinel monitor {master} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {master} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {master} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {master} 1\n"
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start (or start again: the config it rewrote keeps what it learned)."""
        self.process = subprocess.Popen(
            [find_redis_server(), str(self.config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def ask(self, *command: str) -> object:
        client = _client(self.port)
        try:
            return client.execute_command(*command)  # type: ignore[no-untyped-call]
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL it, keeping its directory for a restart."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=5)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class LocalSentinels:
    """A primary, ``replicas`` replicas of it (``--replicaof``, default one), three Sentinels (quorum 2)."""

    def __init__(self, master: str = MASTER_NAME, *, appendonly: bool = False, replicas: int = 1) -> None:
        self.master = master
        # ``primary`` and ``replica`` are the roles at the start; a failover swaps them
        # (``current_primary`` asks the Sentinels). A node restarted keeps its port, data
        # directory and arguments: the first primary comes back as a primary the Sentinels
        # demote, the first replica as a replica of the first primary the Sentinels re-point.
        self.primary = EmbeddedRedis(appendonly=appendonly)
        replica_of = ("--replicaof", "127.0.0.1", str(self.primary.port))
        self.replica = EmbeddedRedis(appendonly=appendonly, extra_args=replica_of)
        self.replicas = [self.replica] + [
            EmbeddedRedis(appendonly=appendonly, extra_args=replica_of) for _ in range(replicas - 1)
        ]
        self.sentinels = [_Sentinel(self.primary.port, master) for _ in range(3)]

    @property
    def url(self) -> str:
        """Celery's spelling of the Sentinel list (``redis.url``)."""
        return ";".join(f"sentinel://127.0.0.1:{s.port}" for s in self.sentinels)

    def start(self, timeout_s: float = 30.0) -> LocalSentinels:
        """Start everything and wait until each Sentinel knows the replica and the other two."""
        try:
            self.primary.start()
            for replica in self.replicas:
                replica.start()
            wait_until(self._replica_online, timeout_s=timeout_s, interval_s=0.05, what="replica in sync")
            for sentinel in self.sentinels:
                sentinel.start()
            wait_until(self._sentinels_agree, timeout_s=timeout_s, interval_s=0.1, what="sentinels agree")
        except BaseException:
            self.close()
            raise
        return self

    def _replica_online(self) -> bool:
        client = _client(self.primary.port)
        try:
            info = client.info("replication")
        except redis.RedisError:
            return False
        finally:
            client.close()
        count = len(self.replicas)
        states = [info.get(f"slave{i}", {}).get("state") for i in range(count)]
        return int(info.get("connected_slaves", 0)) == count and states == ["online"] * count

    def _sentinels_agree(self) -> bool:
        for sentinel in self.sentinels:
            try:
                replicas = sentinel.ask("SENTINEL", "REPLICAS", self.master)
                others = sentinel.ask("SENTINEL", "SENTINELS", self.master)
            except redis.RedisError:
                return False
            if not isinstance(replicas, list) or not isinstance(others, list):
                return False
            if len(replicas) != len(self.replicas) or len(others) != len(self.sentinels) - 1:
                return False
        return True

    def primary_port(self) -> int | None:
        """The port the Sentinels' majority names as the primary now."""
        named: list[int] = []
        for sentinel in self.sentinels:
            with contextlib.suppress(redis.RedisError):
                reply = sentinel.ask("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master)
                if isinstance(reply, list) and len(reply) == 2:
                    named.append(int(reply[1]))
        for port in set(named):
            if named.count(port) * 2 > len(self.sentinels):
                return port
        return None

    @property
    def nodes(self) -> list[EmbeddedRedis]:
        """Every data node, whatever its role now."""
        return [self.primary, *self.replicas]

    def current_primary(self) -> EmbeddedRedis | None:
        """The node the Sentinels' majority names as the primary now."""
        port = self.primary_port()
        return next((n for n in self.nodes if n.port == port), None)

    def other(self, node: EmbeddedRedis) -> EmbeddedRedis:
        """A data node that is not ``node`` (the only one with one replica)."""
        return next(n for n in self.nodes if n is not node)

    @staticmethod
    def settled_primary(node: EmbeddedRedis) -> bool:
        """Whether ``node`` answers as a primary."""
        return _role(node.port)[0] == "master"

    def settled(self) -> bool:
        """One primary named by the majority, answering as one, and every other node in sync with it."""
        primary = self.current_primary()
        if primary is None or _role(primary.port) != ("master", 1):
            return False
        return all(_role(node.port) == ("slave", 1) for node in self.nodes if node is not primary)

    def kill_primary(self) -> None:
        """SIGKILL the primary, as a host dying under it."""
        process = self.primary.process
        assert process is not None
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=5)

    def primary_stopped(self, stopped: bool) -> None:
        """SIGSTOP the first primary (its connections stay open and silent), or SIGCONT it."""
        process = self.primary.process
        assert process is not None
        os.kill(process.pid, signal.SIGSTOP if stopped else signal.SIGCONT)

    def replica_stopped(self, stopped: bool) -> None:
        """SIGSTOP the replica (it falls behind: nothing reaches it), or SIGCONT it."""
        process = self.replica.process
        assert process is not None
        os.kill(process.pid, signal.SIGSTOP if stopped else signal.SIGCONT)

    def await_promotion(self, timeout_s: float = 30.0) -> None:
        """Wait until the Sentinels name the replica and it answers as a primary."""

        def promoted() -> bool:
            if self.primary_port() != self.replica.port:
                return False
            client = _client(self.replica.port)
            try:
                return client.info("replication").get("role") == "master"
            except redis.RedisError:
                return False
            finally:
                client.close()

        wait_until(promoted, timeout_s=timeout_s, interval_s=0.05, what="the replica promoted")

    def sentinels_agree(self) -> bool:
        """Whether each Sentinel knows the replica and the other two (after a restart of one)."""
        return self._sentinels_agree()

    def close(self) -> None:
        """Stop every process and remove their directories."""
        for sentinel in self.sentinels:
            sentinel.close()
        for replica in self.replicas:
            replica.close()
        self.primary.close()
