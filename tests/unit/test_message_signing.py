"""broker.signing: all three paths or none; every role's app signs and accepts only signed tasks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu.serialization import dumps, loads
from pydantic import ValidationError

from tests.signing import SigningFiles, kombu_registry_restored, make_signing_files
from workers.celery_app import create_app
from workers.celery_config import celery_config
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
