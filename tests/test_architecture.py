"""House-style checks that read the source tree (habits 1, 3, 8, 9, 10)."""

from __future__ import annotations

import inspect
import io
import re
import tokenize
from pathlib import Path

import pytest

import workers.errors

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".venv", ".git", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"}


def _python_files(*roots: str) -> list[Path]:
    files: list[Path] = []
    for root in roots:
        path = ROOT / root
        if path.is_file():
            files.append(path)
            continue
        files.extend(p for p in sorted(path.rglob("*.py")) if not SKIP_DIRS & set(p.relative_to(ROOT).parts))
    return files


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _grep(pattern: str, files: list[Path], *, exclude: frozenset[str] = frozenset()) -> list[str]:
    regex = re.compile(pattern)
    hits = []
    for path in files:
        if _rel(path) in exclude:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if regex.search(line):
                hits.append(f"{_rel(path)}:{number}: {line.strip()}")
    return hits


# --- habit 10: small modules ----------------------------------------------------------------

MAX_MODULE_LINES = 600


def test_modules_stay_under_the_line_ceiling() -> None:
    # Given
    files = _python_files("workers", "tasks")
    assert len(files) > 10  # the walk found the package
    # When
    offenders = {
        _rel(p): n for p in files if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    # Then
    if offenders:
        print("modules over the ceiling:", offenders)
    assert offenders == {}


# --- habit 2: the clock is injected into the core -------------------------------------------

CLOCK_READS = r"time\.(time|monotonic|sleep)\(|datetime\.now\("


def test_core_reads_no_clock_and_never_sleeps() -> None:
    files = _python_files("workers/core")
    assert files
    assert _grep(CLOCK_READS, files) == []


def test_clock_grep_can_find_a_clock_read() -> None:
    assert re.search(CLOCK_READS, "started = time.monotonic()")
    assert re.search(CLOCK_READS, "datetime.now(tz=UTC)")


# --- habit 6: configuration is read in one place --------------------------------------------

ENVIRONMENT = r"os\.environ|getenv"
SETTINGS_MODULES = frozenset({"workers/settings.py", "workers/config_file.py"})


def test_environment_is_read_only_by_settings() -> None:
    files = _python_files("workers", "tasks", "beat_schedule.py")
    assert _grep(ENVIRONMENT, files, exclude=SETTINGS_MODULES) == []


# --- habit 14: never eager ------------------------------------------------------------------

# Spelled in two halves so this file does not match its own check.
EAGER = "always" + "_eager"


def test_nothing_runs_tasks_eagerly() -> None:
    files = [
        p
        for p in ROOT.rglob("*")
        if p.is_file()
        and not SKIP_DIRS & set(p.relative_to(ROOT).parts)
        and p.suffix in {".py", ".toml", ".cfg", ".ini", ".md", ".yaml", ".yml", ".env", ""}
    ]
    assert _grep(re.escape(EAGER), files) == []


# --- habit 3: one exception hierarchy -------------------------------------------------------


def _exported_classes() -> dict[str, type]:
    return {
        name: obj for name in workers.errors.__all__ if inspect.isclass(obj := getattr(workers.errors, name))
    }


@pytest.mark.parametrize("name", sorted(n for n in workers.errors.__all__ if n.endswith("Error")))
def test_every_exported_error_is_an_unstuck_error(name: str) -> None:
    assert issubclass(_exported_classes()[name], workers.errors.UnstuckError)


def test_every_exported_exception_is_in_the_tree_or_an_interrupt() -> None:
    # Non-"Error" names (ToolNotFound, ToolTimeout, LoopDetected, ...) belong to the tree too;
    # only BaseException interrupts stand outside it, on purpose.
    for name, cls in _exported_classes().items():
        if issubclass(cls, BaseException):
            assert issubclass(cls, workers.errors.UnstuckError) or not issubclass(cls, Exception), name


def test_no_bare_exception_or_runtime_error_is_raised() -> None:
    files = _python_files("workers", "tasks")
    assert _grep(r"raise (Exception|RuntimeError)\(", files) == []


# --- habit 8: keys are spelled in one module ------------------------------------------------

KEY_LITERAL = re.compile(r":(call|late|lease|calls|open|done|history|run|due)(:|}|\"|'|$)")
KEYS_MODULE = "workers/store/keys.py"


def _string_literals(path: Path) -> list[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    found = []
    for token in tokens:
        if token.type == tokenize.STRING or token.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            found.append((token.start[0], token.string))
    return found


def _key_literals(files: list[Path]) -> list[str]:
    return [
        f"{_rel(path)}:{line}: {text}"
        for path in files
        if _rel(path) != KEYS_MODULE
        for line, text in _string_literals(path)
        if KEY_LITERAL.search(text.strip("'\"rbf"))
    ]


def test_key_prefixes_are_spelled_only_in_the_keys_module() -> None:
    files = _python_files("workers", "tasks", "beat_schedule.py")
    assert ROOT / KEYS_MODULE in files
    assert _key_literals(files) == []


def test_key_literal_check_finds_a_key_in_the_keys_module() -> None:
    # The keys module itself spells them, so the check would see a stray copy elsewhere.
    assert KEY_LITERAL.search('f"{prefix}:due"')
    assert KEY_LITERAL.search("unstuck:{tag}:lease:c1")
    assert any(KEY_LITERAL.search(text) for _, text in _string_literals(ROOT / KEYS_MODULE))
