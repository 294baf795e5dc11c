"""Every fenced block of README.md and docs/*.md is checked by running it, as far as it can run here.

python: compiled, and every name it imports is imported. sh: run under ``bash -eo pipefail``
in a scratch directory without Redis, each ``# expect:`` line must be in the output (the
runbook's blocks run against a live stack in tests/e2e/test_runbook.py). json, json5, toml:
loaded as the ``UNSTUCK_CONFIG`` file through ``load_settings``. js: ``node --check``. text:
output and pictures. A block marked ``<!-- doc-test: skip (why) -->`` on the line above is
counted and named, never run.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness import REPO
from workers.settings import load_settings

PAGES = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
RUN_ELSEWHERE = {"runbook.md": "tests/e2e/test_runbook.py"}
LANGUAGES = frozenset({"python", "sh", "json", "json5", "toml", "js", "text"})
# Raising this is a deliberate edit: a block that cannot run here must say why.
EXPECTED_SKIPS = 10

_FENCE = re.compile(
    r"^(?:<!-- doc-test: skip \((?P<why>.+?)\) -->\n)?```(?P<lang>[a-z0-9]*)\n(?P<body>.*?)^```$",
    flags=re.DOTALL | re.MULTILINE,
)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    body: str
    skip: str | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks_of(name: str, text: str) -> list[Block]:
    found = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start("lang")) + 1
        found.append(Block(name, line, match["lang"], match["body"], match["why"]))
    return found


def _all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks_of(page.name, page.read_text(encoding="utf-8"))]


BLOCKS = _all_blocks()


def _of(*langs: str) -> list[Block]:
    return [b for b in BLOCKS if b.lang in langs and b.skip is None and b.page not in RUN_ELSEWHERE]


def _ids(blocks: list[Block]) -> list[str]:
    return [block.where for block in blocks]


def test_the_block_reader_sees_languages_markers_and_lines() -> None:
    text = "x\n<!-- doc-test: skip (needs a server) -->\n```sh\nserve\n```\n\n```python\nimport os\n```\n"
    first, second = blocks_of("p.md", text)
    assert (first.lang, first.skip, first.body, first.line) == ("sh", "needs a server", "serve\n", 3)
    assert (second.lang, second.skip, second.line) == ("python", None, 7)


def test_every_block_names_a_language_this_test_handles() -> None:
    assert len(BLOCKS) > 30
    assert [b.where for b in BLOCKS if b.lang not in LANGUAGES] == []


def test_skipped_blocks_are_counted_and_each_says_why() -> None:
    skipped = [(b.where, b.skip) for b in BLOCKS if b.skip is not None]
    assert all(why and why.strip() for _, why in skipped)
    assert len(skipped) == EXPECTED_SKIPS, skipped


def test_pages_whose_blocks_run_elsewhere_name_their_test() -> None:
    for page, test in RUN_ELSEWHERE.items():
        assert (REPO / test).is_file()
        assert any(b.page == page and b.lang == "sh" for b in BLOCKS)


@pytest.mark.parametrize("block", _of("python"), ids=_ids(_of("python")))
def test_python_block_compiles_and_its_imports_resolve(block: Block) -> None:
    tree = compile(block.body, block.where, "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    assert isinstance(tree, ast.Module)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                _check_module(alias.name, (), block.where)
        elif isinstance(node, ast.ImportFrom) and node.module:
            _check_module(node.module, tuple(a.name for a in node.names), block.where)


def _check_module(name: str, names: tuple[str, ...], where: str) -> None:
    """Our modules are imported and must hold ``names``; a third-party one must be installed."""
    if name.split(".")[0] not in ("workers", "tasks"):
        # Importing the providers' SDKs costs seconds each; being installed (dev extras) is enough.
        assert importlib.util.find_spec(name.split(".")[0]) is not None, f"{where}: {name} is not installed"
        return
    module = importlib.import_module(name)
    missing = [n for n in names if not hasattr(module, n)]
    assert missing == [], f"{where}: {name} has no {missing}"


def _scratch_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNSTUCK_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _expected(block: Block) -> list[str]:
    return [line.split(":", 1)[1].strip() for line in block.body.splitlines() if line.startswith("# expect:")]


@pytest.mark.parametrize("block", _of("sh"), ids=_ids(_of("sh")))
def test_sh_block_runs_and_prints_what_the_page_says(block: Block, tmp_path: Path) -> None:
    if shutil.which("jq") is None and "jq " in block.body:
        pytest.fail(f"{block.where} needs jq (.ci/run installs it)")
    done = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", block.body],
        env=_scratch_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    where = f"{block.where}\n{block.body}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == 0, where
    assert _expected(block), f"{block.where}: a run block says what it prints (# expect: ...)"
    for text in _expected(block):
        assert text in done.stdout, where


_SUFFIX = {"json": ".json", "json5": ".json5", "toml": ".toml"}


@pytest.mark.parametrize("block", _of(*_SUFFIX), ids=_ids(_of(*_SUFFIX)))
def test_config_block_loads_as_a_config_file(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("UNSTUCK_"):
            monkeypatch.delenv(name)
    path = tmp_path / f"config{_SUFFIX[block.lang]}"
    path.write_text(block.body, encoding="utf-8")
    load_settings(config=str(path))


@pytest.mark.parametrize("block", _of("js"), ids=_ids(_of("js")))
def test_js_block_is_valid_javascript(block: Block, tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (the e2e Node client test needs it too)")
    path = tmp_path / "block.mjs"
    path.write_text(block.body, encoding="utf-8")
    done = subprocess.run([node, "--check", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{block.where}: {done.stderr}"


def _camel_keys() -> set[str]:
    from pydantic import BaseModel
    from pydantic.alias_generators import to_camel

    from workers import config_file
    from workers.core.loops.config import DetectorToggles, LoopDetectionBlock, PostCompactionGuardBlock

    models: list[type[BaseModel]] = [LoopDetectionBlock, DetectorToggles, PostCompactionGuardBlock]
    models += [m for m in vars(config_file).values() if isinstance(m, type) and issubclass(m, BaseModel)]
    names = {to_camel(name) for model in models for name in model.model_fields}
    return {name for name in names if name != name.lower()}


def test_the_openclaw_page_names_every_camel_case_key() -> None:
    page = (REPO / "docs" / "openclaw-compatibility.md").read_text(encoding="utf-8")
    keys = _camel_keys()
    assert {"timeoutSeconds", "historySize", "failBranch", "windowSize"} <= keys
    assert sorted(key for key in keys if f"`{key}" not in page and f".{key}" not in page) == []


def test_openclaw_is_named_never_described() -> None:
    # Project files name the system whose config unstuck reads.
    phrase = "the " + "reference system"
    roots = [
        REPO / "README.md",
        REPO / "docs",
        REPO / "workers",
        REPO / "tasks",
        REPO / "tests",
        REPO / "deploy",
    ]
    files = [p for root in roots for p in ([root] if root.is_file() else root.rglob("*")) if p.is_file()]
    hits = [
        str(p.relative_to(REPO))
        for p in files
        if p.suffix in {".md", ".py", ".lua", ".yaml", ".toml", ".json"}
        and phrase in p.read_text(encoding="utf-8", errors="replace").lower()
    ]
    assert hits == []
