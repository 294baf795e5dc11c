"""House-style checks that read the source tree (habits 1, 3, 8, 9, 10) and its import graph."""

from __future__ import annotations

import ast
import inspect
import io
import re
import subprocess
import sys
import tokenize
import tomllib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

import grimp
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


# --- habit 1: the pure core imports alone ---------------------------------------------------

PURE_CORE = ("workers.core", "workers.core.run_health", "workers.core.loops", "workers.core.transcript")
HEAVY = ("billiard", "celery", "kombu", "redis")


def _heavy_imports_of(*modules: str) -> list[str]:
    """Top-level names of HEAVY found in sys.modules after importing ``modules`` in a fresh interpreter."""
    code = (
        f"import {', '.join(modules)}, sys; "
        f"print(' '.join(sorted({{name.split('.')[0] for name in sys.modules}} & {set(HEAVY)!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.split()


def test_the_pure_core_imports_without_celery_or_redis() -> None:
    assert _heavy_imports_of(*PURE_CORE) == []


def test_heavy_import_check_finds_celery_behind_the_gateway() -> None:
    assert "celery" in _heavy_imports_of("workers.gateway.client")


# --- no import cycles -----------------------------------------------------------------------


class _Tarjan:
    """Tarjan's algorithm with an explicit stack, so deep import chains cannot hit the recursion limit."""

    def __init__(self, edges: Mapping[str, list[str]]) -> None:
        self.edges = edges
        self.index: dict[str, int] = {}
        self.low: dict[str, int] = {}
        self.stack: list[str] = []
        self.on_stack: set[str] = set()
        self.components: list[set[str]] = []

    def _enter(self, node: str) -> None:
        self.index[node] = self.low[node] = len(self.index)
        self.stack.append(node)
        self.on_stack.add(node)

    def _leave(self, node: str) -> None:
        if self.low[node] != self.index[node]:
            return
        component = set()
        while True:
            member = self.stack.pop()
            self.on_stack.discard(member)
            component.add(member)
            if member == node:
                break
        self.components.append(component)

    def visit(self, root: str) -> None:
        self._enter(root)
        work = [(root, iter(self.edges[root]))]
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    self.low[parent] = min(self.low[parent], self.low[node])
                self._leave(node)
            elif target not in self.index:
                self._enter(target)
                work.append((target, iter(self.edges[target])))
            elif target in self.on_stack:
                self.low[node] = min(self.low[node], self.index[target])


def strongly_connected_components(graph: Mapping[str, Iterable[str]]) -> list[set[str]]:
    """Every strongly connected component of ``graph``; nodes only named as targets count too."""
    edges = {node: sorted(set(targets)) for node, targets in graph.items()}
    for target in {t for targets in edges.values() for t in targets} - edges.keys():
        edges[target] = []
    tarjan = _Tarjan(edges)
    for root in sorted(edges):
        if root not in tarjan.index:
            tarjan.visit(root)
    return tarjan.components


def _ast_imports(path: Path, known: set[str]) -> set[str]:
    """Modules of ``known`` that a file imports (``from a import b`` counts as ``a.b`` when that is one)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found & known


def _import_graph() -> dict[str, set[str]]:
    """Direct imports between our modules: workers, tasks and beat_schedule.

    TYPE_CHECKING-only imports count. The ones in ``workers/__init__.py`` stand for its lazy
    re-exports, which do import those modules at run time (on first attribute access), and
    mypy follows all of them; a cycle through them is as real as any other.

    grimp cannot load a single-module root, so ``beat_schedule``'s own imports are read from
    its source; who imports it comes from grimp's view of it as an external module.
    """
    built = grimp.build_graph("workers", "tasks", include_external_packages=True, cache_dir=None)
    ours = {m for m in built.modules if m.split(".")[0] in {"workers", "tasks"}} | {"beat_schedule"}
    graph = {m: set(built.find_modules_directly_imported_by(m)) & ours for m in ours - {"beat_schedule"}}
    graph["beat_schedule"] = _ast_imports(ROOT / "beat_schedule.py", ours)
    return graph


def test_no_import_cycles_between_our_modules() -> None:
    # Given
    graph = _import_graph()
    assert {"workers.core.models", "tasks.invoke", "beat_schedule"} <= graph.keys()
    assert any("beat_schedule" in targets for targets in graph.values())  # its importers are seen
    # When
    cycles = [sorted(c) for c in strongly_connected_components(graph) if len(c) > 1]
    # Then
    assert cycles == []


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "a"}}
    components = strongly_connected_components(graph)
    assert sorted(sorted(c) for c in components if len(c) > 1) == [["a", "b", "c"]]
    assert sorted(len(c) for c in components) == [1, 1, 3]


def test_beat_schedule_imports_no_redis() -> None:
    # The "only the store talks to Redis" contract cannot include it: see pyproject.toml.
    assert _ast_imports(ROOT / "beat_schedule.py", {"redis"}) == set()


# --- import-linter's explicit source lists stay complete ------------------------------------

# What each boundary contract forbids, and the modules allowed to import it.
BOUNDARIES = {
    "workers.cli": {"workers.cli"},
    "workers.local": {"workers.cli", "workers.local"},
    "redis": {"workers.store"},
}


def _top_modules() -> set[str]:
    children = {p.stem if p.is_file() else p.name for p in (ROOT / "workers").iterdir()}
    modules = {
        f"workers.{name}"
        for name in children
        if (ROOT / "workers" / f"{name}.py").is_file() or (ROOT / "workers" / name / "__init__.py").is_file()
    }
    return (modules - {"workers.__init__"}) | {"tasks"}


@pytest.mark.parametrize("forbidden", sorted(BOUNDARIES))
def test_boundary_contracts_name_every_other_module(forbidden: str) -> None:
    # Given
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    sources = [
        set(c["source_modules"]) for c in contracts["contracts"] if c.get("forbidden_modules") == [forbidden]
    ]
    # Then: exactly one contract, naming every top-level module but the allowed importers
    assert len(sources) == 1
    assert sources[0] == _top_modules() - BOUNDARIES[forbidden]


# --- one file name, one module --------------------------------------------------------------


def duplicate_file_names(paths: Iterable[PurePosixPath]) -> dict[str, list[str]]:
    """File names (``__init__.py`` aside) used by more than one module, with their paths."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        if path.name != "__init__.py":
            by_name[path.name].append(str(path))
    return {name: sorted(found) for name, found in sorted(by_name.items()) if len(found) > 1}


def test_no_two_modules_share_a_file_name() -> None:
    files = [PurePosixPath(_rel(p)) for p in _python_files("workers", "tasks")]
    assert len(files) > 10
    assert duplicate_file_names(files) == {}


def test_duplicate_file_name_check_finds_a_shared_name() -> None:
    paths = [
        "workers/gateway/client.py",
        "workers/store/client.py",
        "workers/a/__init__.py",
        "tasks/__init__.py",
    ]
    assert duplicate_file_names(PurePosixPath(p) for p in paths) == {
        "client.py": ["workers/gateway/client.py", "workers/store/client.py"]
    }
