"""Every command block of docs/runbook.md, run in order against a live stack with a stuck session.

Each block runs under ``bash -eo pipefail`` with ``SESSION`` set to the stuck session; its
``# expect:`` lines must appear in the output (``$VARS`` expanded), ``# expect-absent:``
lines must not, and ``# expect-stderr-absent:`` lines must not appear on stderr.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness import REPO, UNSTUCK, Proc, base_env, start_beat, start_watchdog, start_worker, wait_until
from workers.gateway.client import ToolGateway
from workers.local.embedded_redis import EmbeddedRedis
from workers.settings import Settings
from workers.store.sessions import SessionStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

RUNBOOK = REPO / "docs" / "runbook.md"
SESSION = "rb-stuck"


@dataclass(frozen=True)
class Block:
    script: str
    expect: tuple[str, ...]
    absent: tuple[str, ...]
    stderr_absent: tuple[str, ...]


def blocks(text: str) -> list[Block]:
    found = []
    for body in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL):
        lines = body.splitlines()

        def marked(tag: str, lines: list[str] = lines) -> tuple[str, ...]:
            return tuple(line.split(":", 1)[1].strip() for line in lines if line.startswith(f"# {tag}:"))

        found.append(Block(body, marked("expect"), marked("expect-absent"), marked("expect-stderr-absent")))
    return found


def test_the_block_reader_finds_commands_and_expectations() -> None:
    text = "x\n```sh\nunstuck a\n# expect: A\n# expect-absent: B\n```\n```text\nnot me\n```\n"
    (block,) = blocks(text)
    assert (block.expect, block.absent, block.stderr_absent) == (("A",), ("B",), ())


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, str]]:
    server = EmbeddedRedis().start()
    env = base_env(server.url, UNSTUCK_WATCHDOG__INTERVAL_S="1", UNSTUCK_WATCHDOG__STALLED_AFTER_S="2")
    procs: list[Proc] = []
    try:
        procs += [start_worker(env, name="rb"), start_watchdog(env), start_beat(env)]
        yield env
    finally:
        for proc in procs:
            proc.kill()
        server.close()


def _stuck_session(env: dict[str, str]) -> None:
    """A run whose agent said it was working once, then went silent (it died between turns)."""
    settings = Settings(redis={"url": env["UNSTUCK_REDIS__URL"]})
    gateway = ToolGateway(settings)
    try:
        assert gateway.heartbeat(SESSION, "r1", what="model")
        store = SessionStore(gateway._rt.ledger)
        wait_until(
            lambda: (info := store.run(SESSION, "r1")) is not None and info.klass == "stuck",
            timeout_s=20,
            interval_s=0.1,
            what="the watchdog classes the session stuck",
        )
    finally:
        gateway.close()


def test_every_runbook_command_works_against_a_live_stack(stack: dict[str, str], tmp_path: Path) -> None:
    # Given a live stack and a session the watchdog found stuck
    _stuck_session(stack)
    env = {**stack, "SESSION": SESSION, "STUCK_AFTER_S": "1"}
    env["PATH"] = f"{Path(UNSTUCK).parent}{os.pathsep}{env.get('PATH', '')}"
    found = blocks(RUNBOOK.read_text(encoding="utf-8"))
    assert len(found) >= 8
    # When each block runs, in the order of the page
    for block in found:
        done = subprocess.run(
            ["bash", "-eo", "pipefail", "-c", block.script],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        # Then it succeeds and shows what the page says it shows
        where = f"runbook block:\n{block.script}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        assert done.returncode == 0, where
        for text in block.expect:
            assert _expand(text, env) in done.stdout, where
        for text in block.absent:
            assert _expand(text, env) not in done.stdout, where
        for text in block.stderr_absent:
            assert _expand(text, env) not in done.stderr, where


def _expand(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$([A-Z_]+)", lambda m: env.get(m.group(1), m.group(0)), text)
