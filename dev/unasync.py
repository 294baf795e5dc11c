"""Generate the sync side of every ``_async/`` module: logic written once (issue 43).

Each module under an ``_async/`` subpackage of ``workers/`` is the one hand-written source; its
sibling ``_sync/`` module is generated from it, token by token (:mod:`tokenize`): ``async``
and ``await`` are dropped, ``Awaitable[T]`` becomes ``T``, and the names of :data:`RENAMES`
are replaced (``AsyncLedgerClient`` -> ``LedgerClient``, ``redis.asyncio`` -> ``redis``,
``_async`` -> ``_sync``, ...), in code, strings and comments alike. The result is passed
through ``ruff check --fix`` and ``ruff format`` and starts with a header naming its source.

``python dev/unasync.py`` (``make generate``) writes the generated modules;
``python dev/unasync.py --check`` (``make lint``, ``make check``) writes nothing and fails,
naming them, when one is missing or differs from what its source generates.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Where the ``_async/`` sources are looked for.
PACKAGES = ("workers",)

#: Names replaced in the sync side: dotted ones match a whole prefix of a dotted name
#: (``redis.asyncio.cluster`` -> ``redis.cluster``); the longest match wins.
RENAMES: Mapping[str, str] = {
    "_async": "_sync",
    "AsyncLedgerClient": "LedgerClient",
    "AsyncLedger": "Ledger",
    "AsyncRegistering": "Registering",
    "AsyncWaiter": "Waiter",
    "AsyncIterator": "Iterator",
    "AsyncIterable": "Iterable",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
    "StopAsyncIteration": "StopIteration",
    "aclose": "close",
    "acluster_confirmed": "cluster_confirmed",
    "apipeline": "pipeline",
    "on_async": "on",
    "asyncio": "time",
    "asyncio.sleep": "time.sleep",
    "redis.asyncio": "redis",
    "aredis": "redis",
}

HEADER = "# GENERATED from {source} by dev/unasync.py: do not edit"
_WORD = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\b")
_SELF_ALIAS = re.compile(r"^(\s*import ([\w.]+)) as \2$", re.MULTILINE)

Edit = tuple[int, int, str]  # start offset, end offset, replacement


def rename(dotted: str, renames: Mapping[str, str] = RENAMES) -> str:
    """``dotted`` with its longest renamed prefix replaced, each of its parts renamed otherwise."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        head = ".".join(parts[:end])
        if head in renames:
            tail = [renames.get(part, part) for part in parts[end:]]
            return ".".join([renames[head], *tail])
    return ".".join(renames.get(part, part) for part in parts)


def _rename_words(text: str, renames: Mapping[str, str]) -> str:
    """Every renamed (dotted) name in a string or comment, replaced; prose keeps the word "asyncio"."""

    def renamed(match: re.Match[str]) -> str:
        word = match.group(0)
        return word if word == "asyncio" else rename(word, renames)

    return _WORD.sub(renamed, text)


def _offsets(source: str) -> list[int]:
    """The offset in ``source`` of each line's start (1-based lines, as tokenize counts)."""
    starts, total = [0, 0], 0
    for line in source.splitlines(keepends=True):
        total += len(line)
        starts.append(total)
    return starts


def _dotted_end(tokens: Sequence[tokenize.TokenInfo], index: int) -> int:
    """The index of the last token of the dotted name that starts at ``index`` (no spaces inside)."""
    end = index
    while (
        end + 2 < len(tokens)
        and tokens[end + 1].string == "."
        and tokens[end + 2].type == tokenize.NAME
        and tokens[end + 1].start == tokens[end].end
    ):
        end += 2
    return end


def _edits(source: str, renames: Mapping[str, str]) -> Iterator[Edit]:
    """The edits that turn the asyncio source into its sync side."""
    starts = _offsets(source)
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type != tokenize.NL]

    def at(position: tuple[int, int]) -> int:
        return starts[position[0]] + position[1]

    closing: list[int] = []  # bracket depths at which an Awaitable[ was opened
    depth = index = 0
    while index < len(tokens):
        token = tokens[index]
        following = tokens[min(index + 1, len(tokens) - 1)]
        if token.string == "await" or (
            token.string == "async" and following.string in ("def", "with", "for")
        ):
            yield at(token.start), at(following.start), ""
        elif token.string == "Awaitable" and following.string == "[":
            yield at(token.start), at(following.end), ""
            depth += 1
            closing.append(depth)
            index += 1
        elif token.type == tokenize.NAME:
            end = _dotted_end(tokens, index)
            dotted = "".join(t.string for t in tokens[index : end + 1])
            if (renamed := rename(dotted, renames)) != dotted:
                yield at(token.start), at(tokens[end].end), renamed
            index = end
        elif token.type in (tokenize.STRING, tokenize.COMMENT):
            if (renamed := _rename_words(token.string, renames)) != token.string:
                yield at(token.start), at(token.end), renamed
        elif token.type == tokenize.OP and token.string in "([{":
            depth += 1
        elif token.type == tokenize.OP and token.string in ")]}":
            if closing and closing[-1] == depth:
                closing.pop()
                yield at(token.start), at(token.end), ""
            depth -= 1
        index += 1


def unasync(source: str, renames: Mapping[str, str] = RENAMES) -> str:
    """The sync side of ``source``, before formatting: async keywords dropped, names renamed."""
    out, last = [], 0
    for start, end, text in sorted(_edits(source, renames)):
        out.append(source[last:start])
        out.append(text)
        last = end
    out.append(source[last:])
    return _SELF_ALIAS.sub(r"\1", "".join(out))


def _ruff(args: Sequence[str], text: str, path: Path) -> str:
    command = [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(path), "-"]
    done = subprocess.run(command, input=text, capture_output=True, text=True, check=False, cwd=ROOT)
    if done.returncode not in (0, 1) or not done.stdout:
        raise RuntimeError(f"ruff {' '.join(args)} failed on {path}: {done.stderr.strip()}")
    return done.stdout


def _shown(path: Path, root: Path) -> str:
    """``path`` as the header and messages name it: from ``root`` when under it."""
    resolved = path.resolve()
    return (
        resolved.relative_to(root.resolve()).as_posix()
        if resolved.is_relative_to(root.resolve())
        else str(path)
    )


def generated(source_path: Path, root: Path = ROOT) -> str:
    """The full text of the sync module generated from ``source_path``: header, code, formatted."""
    target = sync_path(source_path)
    text = HEADER.format(source=_shown(source_path, root)) + "\n" + unasync(source_path.read_text())
    text = _ruff(["check", "--fix", "--exit-zero", "--quiet"], text, target)
    return _ruff(["format", "--quiet"], text, target)


def sync_path(source_path: Path) -> Path:
    """Where the module generated from ``source_path`` goes: the sibling ``_sync/`` package."""
    return source_path.parent.parent / "_sync" / source_path.name


def sources(root: Path = ROOT, packages: Sequence[str] = PACKAGES) -> list[Path]:
    """Every hand-written asyncio source: the modules of the ``_async/`` subpackages, ``__init__`` aside."""
    found = (path for package in packages for path in (root / package).rglob("_async/*.py"))
    return sorted(path for path in found if path.name != "__init__.py")


def stale(paths: Sequence[Path], root: Path = ROOT) -> list[Path]:
    """The generated modules among ``paths``' that are missing or differ from their source's output."""
    out = []
    for path in paths:
        target = sync_path(path)
        if not target.exists() or target.read_text() != generated(path, root):
            out.append(target)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Write the generated modules, or with ``--check`` fail when one is stale."""
    parser = argparse.ArgumentParser(description="Generate the sync side of every _async/ module.")
    parser.add_argument("--check", action="store_true", help="write nothing; fail when one is stale")
    parser.add_argument("paths", nargs="*", type=Path, help="sources (default: every _async/ module)")
    options = parser.parse_args(argv)
    paths = [p.resolve() for p in options.paths] or sources()
    if options.check:
        behind = stale(paths)
        for target in behind:
            print(f"stale: {_shown(target, ROOT)} (run make generate)", file=sys.stderr)
        return 1 if behind else 0
    for path in paths:
        target = sync_path(path)
        target.parent.mkdir(exist_ok=True)
        text = generated(path)
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
            print(f"wrote {_shown(target, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
