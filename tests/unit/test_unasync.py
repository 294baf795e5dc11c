"""dev/unasync.py: the sync side of an ``_async/`` module, generated token by token."""

from __future__ import annotations

from pathlib import Path

import pytest

from dev import unasync

SOURCE = '''"""Waits on AsyncLedgerClient, through redis.asyncio."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import redis.asyncio as aredis

from workers.store._async.ledger_client import AsyncLedgerClient


class AsyncWaiter:
    """Waits."""

    async def run(self, send: Callable[[int], Awaitable[list[int]]], client: aredis.Redis) -> int:
        """Run it (await_for is only a word here)."""
        async with client.pipeline() as pipe:  # on AsyncLedgerClient
            sent = await send(await pipe.execute())
        await asyncio.sleep(0.1)
        await client.aclose()
        return len(sent) + len(str(AsyncLedgerClient))
'''


def test_unasync_drops_the_async_keywords_and_renames() -> None:
    # Given an asyncio source
    # When its sync side is made
    text = unasync.unasync(SOURCE)
    # Then no async keyword is left, Awaitable[T] is T, and the table's names are replaced
    assert "async " not in text
    assert "await " not in text
    assert "send: Callable[[int], list[int]]" in text
    assert "with client.pipeline() as pipe:  # on LedgerClient" in text
    assert "sent = send(pipe.execute())" in text
    assert "time.sleep(0.1)" in text
    assert "client.close()" in text
    assert "import redis\n" in text
    assert "from workers.store._sync.ledger_client import LedgerClient" in text
    assert "class Waiter:" in text
    assert '"""Waits on LedgerClient, through redis."""' in text


@pytest.mark.parametrize(
    ("dotted", "expected"),
    [
        ("redis.asyncio.cluster", "redis.cluster"),
        ("redis.asyncio", "redis"),
        ("workers.gateway._async.turns", "workers.gateway._sync.turns"),
        ("asyncio.sleep", "time.sleep"),
        ("self.ledger.aclose", "self.ledger.close"),
        ("untouched.name", "untouched.name"),
    ],
)
def test_rename_replaces_the_longest_prefix_then_each_part(dotted: str, expected: str) -> None:
    assert unasync.rename(dotted) == expected


def test_nested_awaitables_keep_their_inner_brackets() -> None:
    text = unasync.unasync("x: Awaitable[dict[str, Awaitable[int]]] = f()\n")
    assert text == "x: dict[str, int] = f()\n"


def _package(root: Path) -> Path:
    source = root / "pkg" / "_async" / "thing.py"
    source.parent.mkdir(parents=True)
    source.write_text('"""A thing."""\n\n\nasync def f() -> int:\n    """F."""\n    return 1\n')
    return source


def test_generated_module_has_its_header_and_is_formatted(tmp_path: Path) -> None:
    # Given an _async/ source
    source = _package(tmp_path)
    # When its module is generated
    text = unasync.generated(source, tmp_path)
    # Then it names its source and is the sync code
    assert text.splitlines()[0] == "# GENERATED from pkg/_async/thing.py by dev/unasync.py: do not edit"
    assert "\ndef f() -> int:\n" in text
    assert unasync.sync_path(source) == tmp_path / "pkg" / "_sync" / "thing.py"


def test_check_names_a_stale_or_missing_generated_module(tmp_path: Path) -> None:
    # Given a source without its generated module
    source = _package(tmp_path)
    target = unasync.sync_path(source)
    # Then it is stale
    assert unasync.stale([source], tmp_path) == [target]
    # When it is generated, it is current
    target.parent.mkdir()
    target.write_text(unasync.generated(source, tmp_path))
    assert unasync.stale([source], tmp_path) == []
    # And when the generated module is edited by hand, or the source changes, it is stale again
    target.write_text(target.read_text() + "# edited\n")
    assert unasync.stale([source], tmp_path) == [target]
    target.write_text(unasync.generated(source, tmp_path))
    source.write_text(source.read_text().replace("return 1", "return 2"))
    assert unasync.stale([source], tmp_path) == [target]


def test_the_check_command_fails_naming_the_stale_module(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a source whose generated module is missing
    source = _package(tmp_path)
    # When the check runs, it fails and names it
    assert unasync.main(["--check", str(source)]) == 1
    assert str(unasync.sync_path(source)) in capsys.readouterr().err
    # And once generated, the check passes
    assert unasync.main([str(source)]) == 0
    assert unasync.main(["--check", str(source)]) == 0
