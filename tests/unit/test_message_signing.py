"""broker.signing: all three paths or none; every role's app signs and accepts only signed tasks."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu.serialization import dumps, loads
from pydantic import ValidationError

from tests.signing import SigningFiles, kombu_registry_restored, make_signing_files
from workers.celery_edge.app import create_app
from workers.celery_edge.app_config import celery_config
from workers.errors import ConfigError
from workers.settings import Settings

REDIS = "redis://127.0.0.1:6390/0"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> SigningFiles:
    return make_signing_files(tmp_path_factory.mktemp("signing"))


@pytest.fixture(autouse=True)
def _registry() -> Iterator[None]:
    with kombu_registry_restored():
        yield


def _settings(**signing: str) -> Settings:
    return Settings(redis={"url": REDIS}, broker={"signing": signing})


def _paths(files: SigningFiles) -> dict[str, str]:
    return {"key_file": str(files.key), "cert_file": str(files.cert), "cert_store": str(files.store)}


def test_signing_is_off_by_default_and_tasks_stay_plain_json() -> None:
    settings = _settings()
    assert not settings.broker.signing.enabled
    config = celery_config(settings)
    assert config["task_serializer"] == "json"
    assert config["accept_content"] == ["json"]
    assert "security_key" not in config


@pytest.mark.parametrize("missing", ["key_file", "cert_file", "cert_store"])
def test_signing_needs_all_three_paths(files: SigningFiles, missing: str) -> None:
    paths = _paths(files)
    del paths[missing]
    with pytest.raises(ValidationError, match=f"missing: \\['{missing}'\\]"):
        _settings(**paths)


def test_the_app_signs_its_tasks_and_accepts_only_signed_ones(files: SigningFiles) -> None:
    # Every role's app is built by configured_app, which applies signing (the worker role is
    # exercised for real in tests/integration/test_signed_messages.py)
    app = create_app(_settings(**_paths(files)), role="client")
    assert app.conf.task_serializer == "auth"
    assert app.conf.accept_content == ["auth"]
    assert app.conf.result_accept_content == ["json"]  # results live in the ledger, unsigned
    # And the auth serializer is registered with this key: a body round-trips through it
    content_type, encoding, payload = dumps({"x": 1}, serializer="auth")
    assert content_type == "application/data"
    assert loads(payload, content_type, encoding, accept=["application/data"]) == {"x": 1}


def test_an_unreadable_key_is_a_config_error_naming_broker_signing(
    files: SigningFiles, tmp_path: Path
) -> None:
    paths = {**_paths(files), "key_file": str(tmp_path / "absent.key")}
    with pytest.raises(ConfigError, match=r"broker\.signing: FileNotFoundError"):
        create_app(_settings(**paths), role="client")


def _documented_openssl_command() -> list[str]:
    """The ``openssl req`` command of deploy/signing.md, joined across its line continuations."""
    text = (Path(__file__).resolve().parents[2] / "deploy" / "signing.md").read_text()
    start = text.index("openssl req")
    command = text[start : text.index("\n", text.index("-subj", start))].replace("\\\n", " ")
    return shlex.split(command)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl CLI on this host")
def test_the_documented_openssl_command_makes_a_pair_celery_accepts(tmp_path: Path) -> None:
    # Given the key and certificate made exactly as deploy/signing.md says
    argv = _documented_openssl_command()
    assert argv[:2] == ["openssl", "req"]
    subprocess.run(argv, cwd=tmp_path, check=True, capture_output=True, timeout=60)
    (tmp_path / "trusted").mkdir()
    shutil.copy(tmp_path / "unstuck.pem", tmp_path / "trusted" / "unstuck.pem")
    paths = {"key_file": "unstuck.key", "cert_file": "unstuck.pem", "cert_store": "trusted"}
    # When an app is configured with them / Then it signs, and verifies its own signature
    app = create_app(_settings(**{k: str(tmp_path / v) for k, v in paths.items()}), role="client")
    assert app.conf.task_serializer == "auth"
    content_type, encoding, payload = dumps({"job": 1}, serializer="auth")
    assert loads(payload, content_type, encoding, accept=["application/data"]) == {"job": 1}
