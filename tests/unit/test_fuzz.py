"""Fuzz the three places that read untrusted input: never a crash, always a clear error."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from workers.celery_edge.app import celery_config
from workers.cli.main import main
from workers.config_file import translate_reference_config
from workers.core.config_checks import ConfigWarning
from workers.core.deployment_checks import check_deployment, check_endpoint
from workers.core.models import CallJob
from workers.core.transcript.adapters import FORMATS
from workers.errors import ConfigError
from workers.settings import load_settings

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Keys the parsers know, near misses of them, and noise: random keys alone rarely reach deep code.
_CONFIG_KEYS = [
    "agents", "tools", "unstuck", "defaults", "list", "id", "timeoutSeconds", "llm",
    "idleTimeoutSeconds", "timeouts", "loopDetection", "exec", "agent", "tiemoutSeconds",
    "redis", "url", "lease", "ttl_s", "worker", "concurrency", "limits", "hard_grace_s",
    "broker", "signing", "key_file", "cert_file", "cert_store", "digest", "key_password",
]  # fmt: skip
_TRANSCRIPT_KEYS = [
    "role", "content", "type", "text", "id", "name", "arguments", "input", "toolCallId",
    "toolName", "isError", "tool_use_id", "tool_calls", "function", "call_id", "parts",
    "functionCall", "functionResponse", "messages", "stopReason", "toolResult", "assistant",
]  # fmt: skip
_JOB_KEYS = [*CallJob.model_fields, "arguments", "name", "id", "evil", "__class__"]

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=16)
)


def _json_like(keys: list[str]) -> st.SearchStrategy[Any]:
    names = st.sampled_from(keys) | st.text(max_size=8)
    strings = st.sampled_from(keys) | st.text(max_size=16)
    return st.recursive(
        _SCALARS | strings,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(names, inner, max_size=5),
        max_leaves=24,
    )


def _objects(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(keys) | st.text(max_size=8), _json_like(keys), max_size=5)


@FUZZ
@given(raw=_objects(_CONFIG_KEYS))
@example(raw={"agents": {"list": [{"id": "a", "timeoutSeconds": 5}, {"id": "a"}]}})
@example(raw={"agents": {"defaults": {"tools": {"tiemoutSeconds": 3}}}})
@example(raw={"tools": {"timeouts": {"exec": -1}}, "agent": {}})
@example(raw={"unstuck": {"lease": {"ttl_s": 1, "renew_interval_s": 5}}})
@example(raw={"unstuck": {"broker": {"signing": {"key_file": "/nope.key"}}}})
@example(raw={"unstuck": {"broker": {"signing": {"key_file": "k", "cert_file": "c", "cert_store": 7}}}})
@example(raw={"unstuck": {"redis": {"url": "redis://[::1"}, "broker": {"url": "amqp://@:x"}}})
def test_config_loader_returns_a_dict_or_raises_config_error(raw: dict[str, Any]) -> None:
    # When the OpenClaw-shaped config is translated, then loaded as Settings
    error: ConfigError | None = None
    try:
        translated = translate_reference_config(raw)
    except ConfigError as exc:
        error = exc
    if error is not None:
        assert error.problems, "a ConfigError must name at least one key path"
        return
    assert isinstance(translated, dict)
    translated.pop("config", None)  # the unstuck block may name a config file: not read here
    # Then the settings either load or fail with a ConfigError, never anything else
    with contextlib.suppress(ConfigError):
        loaded = load_settings(**translated)
        # And `config check`'s deployment checks read whatever URLs it holds without failing
        warnings = check_deployment(
            redis_url=loaded.redis.url,
            broker_url=loaded.broker.url,
            signing_enabled=loaded.broker.signing.enabled,
        )
        assert all(isinstance(w, ConfigWarning) for w in warnings)


_URL_PARTS = st.sampled_from(
    ["redis", "rediss", "amqp", "amqps", "unix", "memory", "", "redis+socket", "http"]
)
_HOSTS = st.sampled_from(
    ["127.0.0.1", "localhost", "[::1]", "[::1", "10.0.0.1", "db", "", "@", ":"]
) | st.text(max_size=8)


@FUZZ
@given(
    url=st.text(max_size=40)
    | st.builds(
        lambda scheme, user, password, host, port: f"{scheme}://{user}:{password}@{host}:{port}/0",
        _URL_PARTS,
        st.text(max_size=5),
        st.text(max_size=5),
        _HOSTS,
        st.text(max_size=6),
    )
)
def test_deployment_checks_read_any_url_without_failing(url: str) -> None:
    warnings = check_endpoint("unstuck.redis.url", url)
    assert all(w.path == "unstuck.redis.url" and w.message for w in warnings)


@pytest.mark.parametrize("timeout", [float("inf"), 1e308])
def test_an_infinite_tool_timeout_is_a_config_error(timeout: float) -> None:
    # Given a config file whose per-tool timeout is infinite (valid TOML: `exec = inf`)
    raw = {"tools": {"timeouts": {"exec": timeout}}}
    # When it is loaded and turned into Celery settings / Then it is refused as a ConfigError
    with pytest.raises(ConfigError):
        celery_config(load_settings(**translate_reference_config(raw)))


def _run_repair(data: bytes, fmt: str) -> tuple[int, str, str]:
    fd, path = tempfile.mkstemp(suffix=".json")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["repair", "--format", fmt, path])
    finally:
        os.unlink(path)
    return code, out.getvalue(), err.getvalue()


def _assert_clean_exit(data: bytes, fmt: str) -> None:
    code, out, err = _run_repair(data, fmt)
    assert code in (0, 2), f"exit code {code}"
    if code == 2:
        assert out == "", "nothing may reach stdout on a refusal"
        assert err.startswith("unstuck repair: "), err
    else:
        json.loads(out)


_TRANSCRIPTS = st.lists(_objects(_TRANSCRIPT_KEYS), max_size=5).map(lambda v: json.dumps(v).encode())
_DOCUMENTS = _json_like(_TRANSCRIPT_KEYS).map(lambda v: json.dumps(v).encode())


@FUZZ
@given(data=st.binary(max_size=200) | _DOCUMENTS | _TRANSCRIPTS, fmt=st.sampled_from(FORMATS))
@example(data=b"\xff\xfe\x00", fmt="neutral")
@example(data=b'[{"role": "assistant", "content": [{"type": "toolCall", "id": 1}]}]', fmt="neutral")
@example(data=b'{"messages": [{"role": "tool"}]}', fmt="openai-chat")
@example(data=b"NaN", fmt="anthropic")
def test_repair_cli_exits_0_or_2_on_any_input(data: bytes, fmt: str) -> None:
    _assert_clean_exit(data, fmt)


def test_repair_cli_refuses_deeply_nested_json() -> None:
    _assert_clean_exit(b"[" * 100_000 + b"]" * 100_000, "neutral")


_VALID_JOB: dict[str, Any] = {
    "session_key": "s1",
    "run_id": "r1",
    "call": {"id": "c1", "name": "exec", "arguments": {}},
    "submitted_ms": 1,
    "deadline_ms": 2,
    "soft_s": 1.0,
    "hard_s": 2.0,
}


def _mutated_jobs() -> st.SearchStrategy[dict[str, Any]]:
    changes = st.dictionaries(st.sampled_from(_JOB_KEYS), _json_like(_JOB_KEYS), max_size=3)
    drops = st.sets(st.sampled_from(list(_VALID_JOB)), max_size=2)
    return st.builds(
        lambda change, drop: {k: v for k, v in {**_VALID_JOB, **change}.items() if k not in drop},
        changes,
        drops,
    )


@FUZZ
@given(body=_objects(_JOB_KEYS) | _mutated_jobs())
def test_call_job_decoding_accepts_or_raises_validation_error(body: dict[str, Any]) -> None:
    try:
        job = CallJob.model_validate(body)
    except ValidationError:
        return
    assert set(body) <= set(CallJob.model_fields), "unknown fields must be refused"
    assert CallJob.model_validate(job.model_dump()) == job
