"""Every replay fixture through the memory history, and the ``unstuck loops replay`` command."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from workers.cli.main import main
from workers.core.loops import InMemoryLoopHistory, compare_expectations, replay

FIXTURES = sorted((Path(__file__).parents[2] / "fixtures" / "loops").glob("*.json"))


def test_there_are_fixtures() -> None:
    assert len(FIXTURES) >= 20


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fixture_replays_as_expected_in_memory(path: Path) -> None:
    # Given
    case = json.loads(path.read_text())
    # When
    verdicts = replay(case, InMemoryLoopHistory)
    # Then
    assert compare_expectations(verdicts, case["expect"]) == []


def test_compare_reports_each_difference() -> None:
    problems = compare_expectations([{"level": "none", "blocked": False}], [{"level": "warning"}, {}])
    assert problems == [
        "$.expect: 2 expectations for 1 calls",
        "calls[0].level: expected 'warning', got 'none'",
    ]


def _run(
    argv: list[str], stdin: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, Any, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(["loops", "replay", *argv])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else None, err


def test_cli_prints_verdicts_aligned_with_calls(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    case = {
        "config": {},
        "calls": [{"event": "compaction"}, {"tool": "read", "args": {}, "result": "x"}],
        "extra": 1,
    }
    code, out, _ = _run(["-"], json.dumps(case), monkeypatch, capsys)
    assert code == 0
    assert out == [{"event": "compaction", "guardEnabled": True}, {"level": "none", "blocked": False}]


def test_cli_exits_1_on_mismatch(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    case = {"config": {}, "calls": [{"tool": "read", "result": "x"}], "expect": [{"level": "warning"}]}
    code, _, err = _run(["-"], json.dumps(case), monkeypatch, capsys)
    assert code == 1
    assert "calls[0].level" in err


def test_cli_passes_a_fixture_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loops", "replay", str(FIXTURES[0])]) == 0
    assert isinstance(json.loads(capsys.readouterr().out), list)


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("not json", "$: not JSON"),
        ("[]", "$: expected an object"),
        ('{"config": {}}', "$.calls"),
        ('{"config": [], "calls": []}', "$.config: expected an object"),
        ('{"config": {}, "calls": [{"tool": 3}]}', "$.calls[0].tool"),
        ('{"config": {}, "calls": [{"event": "x"}]}', "$.calls[0].event"),
        ('{"config": {}, "calls": [{"tool": "t", "isError": "y"}]}', "$.calls[0].isError"),
    ],
)
def test_cli_bad_input_is_one_line_with_the_path_and_exit_2(
    text: str, path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(["-"], text, monkeypatch, capsys)
    assert code == 2
    assert out is None
    assert err.count("\n") == 1
    assert path in err
    assert "Traceback" not in err


def test_cli_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loops", "replay", str(tmp_path / "nope.json")]) == 2
    assert "nope.json" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text",
    [
        '{"config": {"warningThreshold": 9, "criticalThreshold": 9}, "calls": []}',
        '{"globalConfig": {}, "agentConfig": {"criticalThreshold": 4, "globalCircuitBreakerThreshold": 4}, '
        '"calls": []}',
    ],
)
def test_cli_misordered_thresholds_are_raised_not_refused(
    text: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As OpenClaw does at runtime: the triple is raised into order
    code, out, _ = _run(["-"], text, monkeypatch, capsys)
    assert code == 0
    assert out == []
