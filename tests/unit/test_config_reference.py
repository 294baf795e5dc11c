"""OpenClaw's config as it is: JSON5, "did you mean" at any depth, raised thresholds."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from workers.core.did_you_mean import closest_key, known_keys, unknown_key_message
from workers.core.models import SyntheticReason
from workers.errors import ConfigError
from workers.settings import Settings, load_settings

REFERENCE_JSON5 = """
// OpenClaw's config, as its users write it.
{
  agents: {
    defaults: {
      timeoutSeconds: 600, // whole run
      llm: { idleTimeoutSeconds: 60, },
    },
  },
  tools: {
    loopDetection: {
      enabled: true,
      historySize: 30,
      warningThreshold: 10,
      criticalThreshold: 20,
      globalCircuitBreakerThreshold: 30,
      detectors: { genericRepeat: true, knownPollNoProgress: true, pingPong: true, },
      postCompactionGuard: { windowSize: 3, },
    },
    fallbacks: { web_fetch: { value: "offline", reasons: ['deadline_exceeded'], }, },
    failBranch: { web_fetch: { tool: 'cached_fetch', }, },
    retry: { web_fetch: { attempts: 3, backoff_s: 0.1, multiplier: 1.5, errors: ['TimeoutError'], }, },
  },
}
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("UNSTUCK_"):
            monkeypatch.delenv(name)


def _write(tmp_path: Path, text: str, name: str = "openclaw.json") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _problems(**overrides: Any) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_settings(**overrides)
    return dict(info.value.problems)


@pytest.mark.parametrize("name", ["openclaw.json", "openclaw.json5"])
def test_json5_reference_config_loads_as_written(tmp_path: Path, name: str) -> None:
    # Given OpenClaw's file with comments, trailing commas, unquoted keys and single quotes
    settings = load_settings(config=_write(tmp_path, REFERENCE_JSON5, name))
    # Then every block is read
    assert settings.agents.defaults.run_timeout_s == 600
    assert settings.agents.defaults.llm.idle_timeout_s == 60
    assert settings.tools.loop_detection is not None
    assert settings.tools.loop_detection["historySize"] == 30
    rules = settings.tools.failure_rules()
    assert rules.fallbacks["web_fetch"].value == "offline"
    assert rules.fallbacks["web_fetch"].reasons == (SyntheticReason.DEADLINE_EXCEEDED,)
    assert rules.branches["web_fetch"].tool == "cached_fetch"
    assert rules.retries["web_fetch"].attempts == 3
    assert rules.retries["web_fetch"].retry_on_names == ("TimeoutError",)


def test_broken_json5_names_the_file(tmp_path: Path) -> None:
    problems = _problems(config=_write(tmp_path, "{ tools: { allow: [ } }"))
    (where, why), *_ = problems.items()
    assert where.endswith("openclaw.json")
    assert "not valid json/json5" in why


@pytest.mark.parametrize(
    ("text", "path", "meant"),
    [
        ("{unstuck: {lease: {ttl_sx: 5}}}", "unstuck.lease.ttl_sx", "ttl_s"),
        ("{unstuck: {api: {mcp_prot: 1}}}", "unstuck.api.mcp_prot", "mcp_port"),
        (
            "{tools: {loopDetection: {detectors: {genericRepet: true}}}}",
            "detectors.genericRepet",
            "genericRepeat",
        ),
        ("{tools: {fallbacks: {web_fetch: {valu: 1}}}}", "tools.fallbacks.web_fetch.valu", "value"),
        (
            "{tools: {retry: {web_fetch: {attempts: 2, backof_s: 1}}}}",
            "tools.retry.web_fetch.backof_s",
            "backoff_s",
        ),
        ("{tools: {failBranch: {web_fetch: {tol: 'x'}}}}", "tools.fail_branch.web_fetch.tol", "tool"),
    ],
)
def test_unknown_key_at_any_depth_says_did_you_mean(tmp_path: Path, text: str, path: str, meant: str) -> None:
    problems = _problems(config=_write(tmp_path, text))
    matching = [why for where, why in problems.items() if where.split(" ")[0].endswith(path)]
    assert matching == [f"unknown key; did you mean {meant!r}?"], problems


def test_unknown_fallback_reason_is_refused_with_the_choices(tmp_path: Path) -> None:
    problems = _problems(
        config=_write(tmp_path, "{tools: {fallbacks: {t: {value: 1, reasons: ['loop_blocked']}}}}")
    )
    assert any(
        "'loop_blocked' is not one of" in why and "deadline_exceeded" in why for why in problems.values()
    )


def test_branch_reason_outside_the_worker_is_refused(tmp_path: Path) -> None:
    # A fail-branch runs on the worker: it cannot follow a deadline the gateway noticed
    text = "{tools: {failBranch: {t: {tool: 'u', reasons: ['deadline_exceeded']}}}}"
    assert any(
        "is not one of: timeout_soft, tool_error" in why
        for why in _problems(config=_write(tmp_path, text)).values()
    )


def test_tool_cannot_be_its_own_branch(tmp_path: Path) -> None:
    problems = _problems(config=_write(tmp_path, "{tools: {failBranch: {t: {tool: 't'}}}}"))
    assert any("its own fail-branch" in why for why in problems.values())


def test_misordered_triple_starts_with_a_warning_not_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a block whose critical and breaker thresholds sit at or below the one below them
    text = (
        "{tools: {loopDetection: {enabled: true, warningThreshold: 30, criticalThreshold: 20,"
        " globalCircuitBreakerThreshold: 25}}}"
    )
    # When settings load (start-up)
    with caplog.at_level(logging.WARNING, logger="workers.settings"):
        load_settings(config=_write(tmp_path, text))
    # Then it starts, saying what was raised
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "tools.loopDetection.criticalThreshold: 20 is not above warningThreshold; raised to 31" in logged
    assert (
        "tools.loopDetection.globalCircuitBreakerThreshold: 25 is not above criticalThreshold; raised to 32"
        in logged
    )


def test_known_keys_hold_names_and_aliases() -> None:
    from workers.core.loops.config import LoopDetectionBlock

    keys = known_keys(LoopDetectionBlock)
    assert "history_size" in keys
    assert "historySize" in keys


def test_closest_key_prefers_the_written_style_and_says_nothing_when_far() -> None:
    assert closest_key("historysize", ["history_size", "historySize"]) == "historySize"
    assert closest_key("history_sise", ["history_size", "historySize"]) == "history_size"
    assert closest_key("zzz", ["history_size", "historySize"]) is None


def test_unknown_key_message_walks_nested_models_and_dicts() -> None:
    assert unknown_key_message(Settings, ("lease", "ttl")) == "unknown key; did you mean 'ttl_s'?"
    assert unknown_key_message(Settings, ("tools", "retry", "x", "atempts")) == (
        "unknown key; did you mean 'attempts'?"
    )
    assert unknown_key_message(Settings, ("nothing_like_it",)) == "unknown key"


def test_reference_block_typos_in_snake_case_are_named_too(tmp_path: Path) -> None:
    # tools.loop_detections (snake_case, misspelt) is near loop_detection: an error, not ignored
    problems = _problems(config=_write(tmp_path, "{tools: {loop_detections: {enabled: true}}}"))
    assert problems == {"tools.loop_detections": "unknown key; did you mean 'loop_detection'?"}


def test_reference_keys_unstuck_does_not_use_are_still_ignored(tmp_path: Path) -> None:
    settings = load_settings(
        config=_write(tmp_path, "{tools: {exec: {host: 'sandbox'}, web: {}, profile: 'x'}}")
    )
    assert settings.tools.fallbacks == {}
