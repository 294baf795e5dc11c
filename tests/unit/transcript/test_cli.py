"""``unstuck repair`` in-process through ``main([...])``, plus one real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.transcript.factories import asst, res, user
from workers.cli.main import main

MESSY = [user(), asst("call_1", "call_2"), user("b"), res("call_2"), res("ghost")]


def _run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, document: Any, *args: str
) -> tuple[int, str, str]:
    source = tmp_path / "in.json"
    source.write_text(json.dumps(document))
    code = main(["repair", str(source), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_pairing_step_writes_repaired_json_and_report(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # When
    code, out, err = _run(capsys, tmp_path, MESSY, "--step", "pairing", "--report", "--missing-text", "gone")
    # Then
    repaired = json.loads(out)
    assert code == 0
    assert [m["role"] for m in repaired] == ["user", "assistant", "toolResult", "toolResult", "user"]
    assert repaired[2]["content"] == [{"type": "text", "text": "gone"}]
    report = json.loads(err)
    assert report["droppedOrphanCount"] == 1
    assert len(report["added"]) == 1


def test_stdin_and_no_report(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", _StringStdin(json.dumps([user()])))
    code = main(["repair", "-"])
    out, err = capsys.readouterr()
    assert (code, json.loads(out), err) == (0, [user()], "")


def test_full_pipeline_for_provider(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = _run(capsys, tmp_path, MESSY, "--provider", "mistral", "--report")
    ids = [block["id"] for block in json.loads(out)[1]["content"]]
    assert code == 0
    assert all(len(i) == 9 for i in ids)
    assert json.loads(err)["ids"]["rewrittenCallIds"] == 2


@pytest.mark.parametrize(
    ("step", "flag", "value"), [("inputs", "--allowed-tools", "write"), ("ids", "--id-mode", "strict")]
)
def test_single_steps(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, step: str, flag: str, value: str
) -> None:
    code, out, _ = _run(capsys, tmp_path, MESSY, "--step", step, flag, value)
    first = json.loads(out)[1]
    assert code == 0
    if step == "inputs":
        assert first["role"] == "user"
    else:
        assert first["content"][0]["id"] == "call1"


def test_errored_turns_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    given = [asst("c1", stop="aborted"), res("c1")]
    _, kept, _ = _run(capsys, tmp_path, given, "--step", "pairing", "--errored-turns", "preserve")
    _, dropped, _ = _run(capsys, tmp_path, given, "--step", "pairing", "--errored-turns", "drop")
    assert json.loads(kept) == given
    assert json.loads(dropped) == []


def test_anthropic_object_keeps_envelope(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    document = {
        "model": "claude",
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}
        ],
    }
    code, out, _ = _run(capsys, tmp_path, document, "--format", "anthropic")
    repaired = json.loads(out)
    assert code == 0
    assert repaired["model"] == "claude"
    assert repaired["messages"][1]["content"][0]["tool_use_id"] == "t1"


def test_policy_printed(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["repair", "--policy", "--provider", "openai", "--model-api", "openai-responses"])
    policy = json.loads(capsys.readouterr().out)
    assert code == 0
    assert policy["missing_tool_result_text"] == "aborted"
    assert policy["allow_synthetic_tool_results"] is True


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            [user(), user(), user(), {"role": "assistant", "content": [{"type": "toolCall", "id": 7}]}],
            "$[3].content[0].id: expected a string",
        ),
        ({"not": "a list"}, "$: expected an array of messages"),
    ],
)
def test_malformed_input_exit_2_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, document: Any, message: str
) -> None:
    code, out, err = _run(capsys, tmp_path, document)
    assert (code, out) == (2, "")
    assert err == f"unstuck repair: {message}\n"


def test_invalid_json_and_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    assert main(["repair", str(bad)]) == 2
    assert main(["repair", str(tmp_path / "missing.json")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 2
    assert "Traceback" not in err


def test_flags_override_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["repair", "--policy", "--errored-turns", "preserve", "--id-mode", "strict9", "--missing-text", "x"]
    )
    policy = json.loads(capsys.readouterr().out)
    assert code == 0
    assert (policy["errored_turns"], policy["tool_call_id_mode"], policy["missing_tool_result_text"]) == (
        "preserve",
        "strict9",
        "x",
    )


def test_subprocess_entry_point(tmp_path: Path) -> None:
    # Given
    source = tmp_path / "t.json"
    source.write_text(json.dumps(MESSY))
    executable = Path(sys.executable).with_name("unstuck")
    # When
    done = subprocess.run(
        [str(executable), "repair", str(source), "--report"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Then
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)) == 5
    assert json.loads(done.stderr)["changed"] is True


class _StringStdin:
    def __init__(self, text: str) -> None:
        self._text = text

    def read(self) -> str:
        return self._text
