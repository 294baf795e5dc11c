"""Secrets never survive ``workers.core.redact``; everything else stays readable."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.core.redact import (
    MASK,
    is_sensitive_key,
    redact,
    redact_every_pattern,
    redact_mapping,
    redact_url,
)

TEXT_CASES = [
    ("redis://app:s3cret@redis:6379/0", "redis://app:****@redis:6379/0"),
    ("rediss://:s3cret@redis:6380/1", "rediss://:****@redis:6380/1"),
    ("amqp://guest:p@ss@rabbit:5672//", "amqp://guest:****@rabbit:5672//"),
    (
        "cannot reach redis://u:pw@h:1/0 (ConnectionError)",
        "cannot reach redis://u:****@h:1/0 (ConnectionError)",
    ),
    ("redis://redis:6379/0", "redis://redis:6379/0"),
    ("Authorization: Bearer eyJhbGciOi.x-y", "Authorization: ****"),
    ("authorization:Basic dXNlcjpwYXNz", "authorization:****"),
    ("Proxy-Authorization: Basic Zm9vOmJhcg==", "Proxy-Authorization: ****"),
    ("Cookie: sid=abc; theme=dark", "Cookie: ****"),
    ("Set-Cookie: sid=abc; HttpOnly", "Set-Cookie: ****"),
    ("X-Api-Key: k-123\nAccept: */*", "X-Api-Key: ****\nAccept: */*"),
    ("{'Authorization': 'Bearer abc', 'Accept': 'x'}", "{'Authorization': '****', 'Accept': 'x'}"),
    ('{"x-api-key": "k1", "user": "bob"}', '{"x-api-key": "****", "user": "bob"}'),
    ('{"password": "hun\\"ter2", "user": "bob"}', '{"password": "****", "user": "bob"}'),
    ('{"dbPassword": "pw"}', '{"dbPassword": "****"}'),
    ("sent Bearer abcdef to upstream", "sent Bearer **** to upstream"),
    ("Basic dXNlcjpwYXNz", "Basic ****"),
    ("GET /cb?code=1&access_token=abc&x=2", "GET /cb?code=1&access_token=****&x=2"),
    ("password=hunter2 secret=s3 token=t0k", "password=**** secret=**** token=****"),
    ("client_secret=abc;api_key=def", "client_secret=****;api_key=****"),
    # Prose and non-secret names are left alone.
    ("Basic authentication failed", "Basic authentication failed"),
    ("the token expired", "the token expired"),
    ("max_tokens=100 tokens_used=7", "max_tokens=100 tokens_used=7"),
    ("key_prefix=unstuck", "key_prefix=unstuck"),
    ("", ""),
]


@pytest.mark.parametrize(("text", "expected"), TEXT_CASES)
def test_redact_masks_secret_values_only(text: str, expected: str) -> None:
    # Given a line that may carry secrets / When redacted / Then only the values are masked
    assert redact(text) == expected


@pytest.mark.parametrize(("text", "expected"), TEXT_CASES)
def test_redact_is_idempotent(text: str, expected: str) -> None:
    assert redact(expected) == expected


URL_CASES = [
    ("redis://default:pw@h:6379/0", "redis://default:****@h:6379/0"),
    ("redis://u:p@ss@h/0", "redis://u:****@h/0"),
    (
        "rediss://h:6380/0?password=x&ssl_cert_reqs=required",
        "rediss://h:6380/0?password=****&ssl_cert_reqs=required",
    ),
    ("https://api.example/v1?q=a&token=abc#frag", "https://api.example/v1?q=a&token=****#frag"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("http://[::1", "http://[::1"),
    ("", ""),
]


@pytest.mark.parametrize(("url", "expected"), URL_CASES)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


@pytest.mark.parametrize(
    ("key", "sensitive"),
    [
        ("Authorization", True),
        ("PROXY-AUTHORIZATION", True),
        ("Cookie", True),
        ("X-Api-Key", True),
        ("api_key", True),
        ("apiKey", True),
        ("access_token", True),
        ("authToken", True),
        ("db_password", True),
        ("client_secret", True),
        ("Content-Type", False),
        ("max_tokens", False),
        ("key_prefix", False),
        ("url", False),
    ],
)
def test_is_sensitive_key(key: str, sensitive: bool) -> None:
    assert is_sensitive_key(key) is sensitive


def test_redact_mapping_masks_nested_values_and_keeps_the_rest() -> None:
    # Given an http_fetch-like result with secrets in headers, URLs and lists
    result: dict[str, Any] = {
        "status": 200,
        "headers": {"Set-Cookie": "sid=1", "Content-Type": "text/html"},
        "url": "redis://u:pw@h/0",
        "calls": [{"token": "t"}, "Bearer abcdefgh"],
        "pair": ("password=x", 3),
        "empty_password": "",
        "max_tokens": 5,
    }
    # When
    out = redact_mapping(result)
    # Then
    assert out == {
        "status": 200,
        "headers": {"Set-Cookie": MASK, "Content-Type": "text/html"},
        "url": "redis://u:****@h/0",
        "calls": [{"token": MASK}, "Bearer ****"],
        "pair": ("password=****", 3),
        "empty_password": "",
        "max_tokens": 5,
    }
    assert result["headers"]["Set-Cookie"] == "sid=1", "the input must not be modified"


_SECRETS = st.text(alphabet="abcdefghijkLMNOPQ0123456789", min_size=6, max_size=24)
_TEMPLATES = [
    "redis://user:{s}@host:6379/0",
    "Authorization: Bearer {s}",
    "X-Api-Key: {s}",
    "{{'Cookie': '{s}'}}",
    "https://h/p?x=1&access_token={s}&y=2",
    'cfg {{"password": "{s}"}}',
    "call with Bearer {s} failed",
]


@settings(max_examples=60, deadline=None)
@given(secret=_SECRETS, template=st.sampled_from(_TEMPLATES), prefix=st.text(max_size=20))
def test_no_secret_survives(secret: str, template: str, prefix: str) -> None:
    # Given a secret embedded in a known carrier, after arbitrary text on its own line
    text = prefix + "\n" + template.format(s=secret)
    # When / Then
    assert secret not in redact(text).rpartition("\n")[2]


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_redact_never_raises_and_is_idempotent(text: str) -> None:
    once = redact(text)
    assert redact(once) == once
    assert isinstance(redact_url(text), str)


# Words and characters the patterns are built from, mixed with text that is none of them, so
# hypothesis reaches both sides of redact's first look (folded forms included: KELVIN SIGN K).
_PIECES = st.sampled_from(
    [
        "@",
        ":",
        "=",
        "'",
        '"',
        " ",
        "\n",
        "://",
        "Bearer ",
        "basic ",
        "Token ",
        "digest ",
        "auth",
        "Authorization",
        "coo\u212aie",
        "x-api-key",
        "API_KEY",
        "apikey",
        "passwd",
        "PassWord",
        "pwd",
        "secret",
        "credentials",
        "x-amz-security-token",
        "abcDEF123+/=",
        "user",
        "redis",
        "s3cret",
    ]
)


_KEYS = st.sampled_from(
    [
        "auth",
        "Authorization",
        "coo\u212aie",
        "set-cookie",
        "x-api-key",
        "API_KEY",
        "api-key",
        "apikey",
        "passwd",
        "PassWord",
        "db_pwd",
        "secret",
        "credentials",
        "x-amz-security-token",
        "tok",
        "user",
    ]
)
_SEPARATORS = st.sampled_from([":", ": ", "=", "'='", '":"', " ", "://u:", "@"])
_VALUES = st.sampled_from(["Bearer ", "basic ", "Token ", "digest ", "abcDEF123+/=", "s3cret", "'x'", "@h"])


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.tuples(_KEYS, _SEPARATORS, _VALUES) | st.text(max_size=6).map(lambda t: (t, "", "")), max_size=6
    )
)
def test_redact_first_look_never_skips_a_secret(pieces: list[tuple[str, str, str]]) -> None:
    # Given text made of key, separator and value pieces of the patterns, and of anything else
    text = " ".join("".join(piece) for piece in pieces)
    # Then redact, which skips text without a hint of a secret, masks as every pattern does
    assert redact(text) == redact_every_pattern(text)


@pytest.mark.parametrize(
    "text",
    [
        "db_pwd=abc123",
        "x-amz-security-token: abc",
        "coo\u212aie: a=b",
        "API_KEY=k1",
        "u://a:b@h",
        "Digest abcDEF123+/=",
    ],
)
def test_redact_first_look_finds_every_kind(text: str) -> None:
    assert redact(text) != text
    assert redact(text) == redact_every_pattern(text)
