"""Who may use a door: bearer tokens compared in constant time; no tokens means loopback only."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from workers.errors import ConfigError
from workers.servers.auth import bearer_ok, check_exposure

TOKENS = (SecretStr("s3cret"), SecretStr("other"))


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("Bearer s3cret", True),
        ("bearer other", True),
        ("Bearer s3cre", False),
        ("Bearer s3cret2", False),
        ("Basic s3cret", False),
        ("Bearer", False),
        ("", False),
        (None, False),
    ],
)
def test_a_bearer_token_must_match_one_configured(header: str | None, ok: bool) -> None:
    assert bearer_ok(header, TOKENS) is ok


def test_without_tokens_every_caller_is_let_in() -> None:
    assert bearer_ok(None, ())


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "[::1]", "localhost"])
def test_loopback_needs_no_tokens(host: str) -> None:
    check_exposure(host, (), door="unstuck serve")


@pytest.mark.parametrize("host", ["0.0.0.0", "", "10.1.2.3", "example.com"])
def test_anything_else_needs_tokens(host: str) -> None:
    with pytest.raises(ConfigError, match="UNSTUCK_API__TOKENS"):
        check_exposure(host, (), door="unstuck serve")
    check_exposure(host, TOKENS, door="unstuck serve")
