"""House-style checks that read the source tree and its import graph."""

from __future__ import annotations

import ast
import inspect
import io
import re
import subprocess
import sys
import tokenize
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import grimp
import pytest

import workers.errors
from workers.store.records import declared_field

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {
    ".venv",
    ".venv-latest",
    ".git",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
}


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


# --- small modules --------------------------------------------------------------------------------

MAX_MODULE_LINES = 600
# Cohesive modules allowed past the ceiling, with theirs: one model is not split across files.
LONGER_MODULES = {
    # Every setting's Field carries the description docs/configuration.md is rendered from.
    # 870 before mcp.upstreams_file (its entries checked at load), 880 before openclaw.alert_*
    # and tombstone_scan_interval_s, 884 before worker.give_back_after_ms, 888 before
    # worker.log_each_task
    "workers/settings.py": 894,
    # Every Redis record declared once (key, type, TTL, writers, readers, fields) and read by name.
    "workers/store/records.py": 840,
    # Every span's life in one place: opened by its caller, ended by whoever answers the call
    # (the caller, the worker's main process, the watchdog), ids kept across processes.
    "workers/tracing/spans.py": 680,
}


def test_modules_stay_under_the_line_ceiling() -> None:
    # Given
    files = _python_files("workers", "tasks")
    assert len(files) > 10  # the walk found the package
    # When
    offenders = {
        _rel(p): n
        for p in files
        if (n := len(p.read_text(encoding="utf-8").splitlines()))
        > LONGER_MODULES.get(_rel(p), MAX_MODULE_LINES)
    }
    # Then
    if offenders:
        print("modules over the ceiling:", offenders)
    assert offenders == {}


# --- the clock is injected into the core ----------------------------------------------------------

CLOCK_READS = r"time\.(time|monotonic|sleep)\(|datetime\.now\("


def test_core_reads_no_clock_and_never_sleeps() -> None:
    files = _python_files("workers/core")
    assert files
    assert _grep(CLOCK_READS, files) == []


def test_clock_grep_can_find_a_clock_read() -> None:
    assert re.search(CLOCK_READS, "started = time.monotonic()")
    assert re.search(CLOCK_READS, "datetime.now(tz=UTC)")


# --- configuration is read in one place -----------------------------------------------------------

ENVIRONMENT = r"os\.environ|getenv"
# workers/tracing/setup.py reads OpenTelemetry's own OTEL_* variables (the SDK's contract, not
# unstuck settings), as the SDK does.
SETTINGS_MODULES = frozenset({"workers/settings.py", "workers/config_file.py", "workers/tracing/setup.py"})


def test_environment_is_read_only_by_settings() -> None:
    files = _python_files("workers", "tasks", "beat_schedule.py")
    assert _grep(ENVIRONMENT, files, exclude=SETTINGS_MODULES) == []


# --- comments point only inside the repository ----------------------------------------------------

# A spec section, a house-style habit or an issue number means nothing to a reader of the
# repository alone: a comment states the rule itself or links a page under docs/. Spelled in
# pieces so this file does not match its own check.
OUTSIDE_POINTERS = "|".join(
    [
        "\N{SECTION SIGN}",  # spec §4.2
        r"\bhabits? \d",  # habit 7
        r"\bissues? #?\d+",  # issue 13, issue #13
        r"(?<![\w&])#\d{2,}\b",  # (#13)
        "reference " + "system",  # the product it imitates is named: OpenClaw
    ]
)


def _source_files(*roots: str) -> list[Path]:
    return _python_files(*roots) + [
        p for root in roots if (ROOT / root).is_dir() for p in sorted((ROOT / root).rglob("*.lua"))
    ]


def test_comments_point_nowhere_outside_the_repository() -> None:
    # Given
    files = _source_files("workers", "tasks", "beat_schedule.py")
    assert any(p.suffix == ".lua" for p in files)  # the scripts' comments are read too
    # Then
    assert _grep(OUTSIDE_POINTERS, files) == []


@pytest.mark.parametrize(
    "comment",
    [
        "# see spec \N{SECTION SIGN}3.1",
        "-- habit 4: keys in one module",
        "(issue 13: at most 1 ms)",
        "fixed in #42",
        "as the " + "reference " + "system does",
    ],
)
def test_outside_pointer_grep_finds_each_kind(comment: str) -> None:
    assert re.search(OUTSIDE_POINTERS, comment)


@pytest.mark.parametrize("text", ["color: #00ff00", "&#39;", "habits of the agent", "tissue 3"])
def test_outside_pointer_grep_leaves_ordinary_text(text: str) -> None:
    assert not re.search(OUTSIDE_POINTERS, text)


# --- never eager ----------------------------------------------------------------------------------

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


# --- one exception hierarchy ----------------------------------------------------------------------


def _exported_classes() -> dict[str, type]:
    return {
        name: obj for name in workers.errors.__all__ if inspect.isclass(obj := getattr(workers.errors, name))
    }


@pytest.mark.parametrize("name", sorted(n for n in workers.errors.__all__ if n.endswith("Error")))
def test_every_exported_error_is_an_unstuck_error(name: str) -> None:
    assert issubclass(_exported_classes()[name], workers.errors.UnstuckError)


def test_every_exported_exception_is_in_the_tree_or_an_interrupt() -> None:
    # Non-"Error" names (ToolNotFound, LoopDetected, ...) belong to the tree too;
    # only BaseException interrupts stand outside it, on purpose.
    for name, cls in _exported_classes().items():
        if issubclass(cls, BaseException):
            assert issubclass(cls, workers.errors.UnstuckError) or not issubclass(cls, Exception), name


def test_no_bare_exception_or_runtime_error_is_raised() -> None:
    files = _python_files("workers", "tasks")
    assert _grep(r"raise (Exception|RuntimeError)\(", files) == []


# --- keys are spelled in one module ---------------------------------------------------------------

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


# --- hash fields are named in one module ----------------------------------------------------------

RECORDS_MODULE = "workers/store/records.py"
# Commands that name hash fields, and the ledger's register, whose ``fields`` become the hash.
HASH_COMMANDS = frozenset(
    {"hset", "hsetnx", "hget", "hmget", "hdel", "hincrby", "hincrbyfloat", "hexists", "hstrlen"}
    | {"register", "register_call"}
)
# Tests are left out on purpose: they spell the stored names to pin the format independently.
FIELD_ROOTS = ("workers", "tasks", "beat_schedule.py", "bench")


def _strings(node: ast.AST) -> Iterator[tuple[ast.Constant, str]]:
    """String constants in ``node``: itself, inside containers and calls, literal parts of f-strings."""
    for child in ast.walk(node):
        if isinstance(child, ast.Constant) and isinstance(child.value, str):
            yield child, child.value


def _is_fields(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "fields"  # a CallRecord's raw hash


def _field_uses(node: ast.AST) -> Iterator[ast.AST]:
    """The parts of ``node`` that name hash fields: hash commands, and reads of ``record.fields``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr in HASH_COMMANDS:
            yield from [*node.args, *(k.value for k in node.keywords)]
        elif node.func.attr in ("get", "pop") and _is_fields(node.func.value) and node.args:
            yield node.args[0]
    elif isinstance(node, ast.Subscript) and _is_fields(node.value):
        yield node.slice
    elif isinstance(node, ast.Compare) and any(_is_fields(c) for c in node.comparators):
        yield node.left


def hash_field_literals(source: str, name: str) -> list[str]:
    """Declared field names spelled as string literals where ``source`` names hash fields."""
    return [
        f"{name}:{constant.lineno}: {text!r}"
        for node in ast.walk(ast.parse(source))
        for use in _field_uses(node)
        for constant, text in _strings(use)
        if text and declared_field(text)
    ]


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr)
    }


def any_field_literals(source: str, name: str) -> list[str]:
    """Every string literal (docstrings aside) of ``source`` that is a declared field name."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    return [
        f"{name}:{constant.lineno}: {text!r}"
        for constant, text in _strings(tree)
        if id(constant) not in docs and text and declared_field(text)
    ]


def test_no_module_spells_a_hash_field_in_a_hash_command() -> None:
    # Given every module of the package, its tasks and the benchmarks but the declarations
    files = [p for p in _python_files(*FIELD_ROOTS) if _rel(p) != RECORDS_MODULE]
    assert len(files) > 100
    # Then none names a declared field by a literal in a hash command or a read of a record's fields
    assert [hit for p in files for hit in hash_field_literals(p.read_text(encoding="utf-8"), _rel(p))] == []


def test_no_store_module_spells_a_hash_field_at_all() -> None:
    # The store reads and writes the hashes: there even a list of names handed to HMGET later
    # must use the declared names.
    files = [p for p in _python_files("workers/store") if _rel(p) != RECORDS_MODULE]
    assert len(files) > 10
    assert [hit for p in files for hit in any_field_literals(p.read_text(encoding="utf-8"), _rel(p))] == []


FIELD_SAMPLE = '''
def write(client, ledger, keys, record):
    """Reads the "status" field (a docstring is no use of it)."""
    client.hset(keys.run, "status", "running")
    client.hmget(keys.call("c1"), ["state", CallField.TOOL])
    client.hset(keys.call("c1"), f"pgid:{4}", "1")
    ledger.register_call(keys, "c1", now_ms=1, deadline_ms=2, fields={"dispatched": "1"})
    if "job" in record.fields:
        return int(record.fields.get("attempt", "0")) + int(record.fields["hb_ms"])
    client.set("worker", 1)
    return {"status": "ok"}
'''


def test_the_field_check_finds_literals_in_hash_commands() -> None:
    assert hash_field_literals(FIELD_SAMPLE, "sample.py") == [
        "sample.py:4: 'status'",
        "sample.py:5: 'state'",
        "sample.py:6: 'pgid:'",
        "sample.py:7: 'dispatched'",
        "sample.py:8: 'job'",
        "sample.py:9: 'attempt'",
        "sample.py:9: 'hb_ms'",
    ]


def test_the_store_field_check_finds_a_name_list_but_no_docstring() -> None:
    found = any_field_literals('_PROBED = ["state", "deadline_ms"]\n' + FIELD_SAMPLE, "sample.py")
    assert found[:2] == ["sample.py:1: 'state'", "sample.py:1: 'deadline_ms'"]
    assert "sample.py:11: 'worker'" in found  # any literal, not only in hash commands
    assert not any(hit.startswith("sample.py:4:") for hit in found)  # the docstring line


# --- the pure core imports alone ------------------------------------------------------------------

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


# --- no import cycles -----------------------------------------------------------------------------


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


# --- import-linter's explicit source lists stay complete ------------------------------------------

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
