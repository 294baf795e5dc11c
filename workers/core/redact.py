"""Mask secrets (URL passwords, auth headers, bearer tokens, ``token=`` pairs) before text leaves us.

Pure string work, safe on any input: every function returns a value and never raises, so
it can sit in a log formatter or on a tool result without becoming a new failure mode.
Only values are masked; names, user names and hosts stay readable for debugging::

    redis://app:s3cret@redis:6379/0        -> redis://app:****@redis:6379/0
    Authorization: Bearer eyJhbGci...      -> Authorization: ****
    GET /cb?code=1&access_token=abc        -> GET /cb?code=1&access_token=****

Settings shown to an operator (``unstuck config show``) are masked more strictly by
:func:`redact_settings`: a URL's whole user info, any query value named like a key, token or
signature, and the path of webhook URLs (where chat webhooks keep their secret).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "MASK",
    "RedactingFilter",
    "install_log_redaction",
    "is_sensitive_key",
    "mask_setting_url",
    "redact",
    "redact_mapping",
    "redact_settings",
    "redact_url",
]

MASK = "****"
# Query parameters of a settings URL that may carry a secret (broader than text redaction:
# config show errs on the side of masking).
_SECRET_SETTING_PARAM = re.compile(r"token|key|secret|password|passwd|sig|auth|credential", re.IGNORECASE)

_HEADER_NAMES = (
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
    "x-auth-token",
    "x-access-token",
    "x-amz-security-token",
)
# A key is secret when its name ends in one of these words (``db_password``, ``authToken``).
_SECRET_SUFFIXES = ("token", "password", "passwd", "pwd", "secret", "apikey", "api_key", "credentials")

_HEADER_ALT = "|".join(re.escape(name) for name in _HEADER_NAMES)
_KEY = r"[A-Za-z0-9_.-]*(?:token|password|passwd|pwd|secret|api[_-]?key|credentials)"

_URL_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)(?P<secret>[^\s/]*)@")
# A header name followed by ``:`` masks the rest of its line: over-masking is the safe side.
_HEADER_LINE = re.compile(
    rf"(?im)(?P<head>(?<![\w-])(?:{_HEADER_ALT})[ \t]*:[ \t]*)(?P<secret>[^\s\"'].*?)[ \t]*$"
)
_QUOTED_PAIR = re.compile(
    rf"""(?ix)(?P<head>(?P<q>["'])(?:{_HEADER_ALT}|{_KEY})(?P=q)\s*[:=]\s*(?P<v>["']))"""
    r"""(?P<secret>(?:\\.|(?!(?P=v)).)+)"""
)
_PLAIN_PAIR = re.compile(rf"(?i)(?P<head>\b{_KEY}=)(?P<secret>[^\s&;,#'\"]+)")
_BEARER = re.compile(r"(?i)(?P<head>\bbearer\s+)(?P<secret>[A-Za-z0-9._~+/=-]+)")
# "Basic authentication failed" is prose; "Basic dXNlcjpwYXNz" is a credential (digit, +/= or aB).
_OTHER_SCHEME = re.compile(
    r"(?P<head>\b(?i:basic|token|digest)[ \t]+)"
    r"(?P<secret>(?=[A-Za-z0-9._~+/=-]*(?:[0-9+/=]|[a-z][A-Z]))[A-Za-z0-9._~+/=-]{8,})"
)


def _mask(match: re.Match[str]) -> str:
    if match.group("secret") == MASK:
        return match.group(0)
    return match.group("head") + MASK + match.group(0)[match.end("secret") - match.start() :]


_PATTERNS = (_URL_USERINFO, _HEADER_LINE, _QUOTED_PAIR, _PLAIN_PAIR, _BEARER, _OTHER_SCHEME)
# Each pattern above matches only text holding one of these words, folded by the same case
# rules, or an '@' (user info): a header name's or key's word, or a scheme. Most log lines hold
# none, and an ASCII text is checked for them in a tenth of the time of the six substitutions
# (every log record of every process goes through redact). Other text gets every pattern: the
# regex engine's case folding (KELVIN SIGN is a k) is not str.lower's. tests/unit/test_redact.py
# holds the two paths equal.
_HINTS = (
    "auth", "cookie", "api_key", "api-key", "apikey", "token", "passw", "pwd", "secret",
    "credentials", "bearer", "basic", "digest",
)  # fmt: skip


def redact(text: str) -> str:
    """``text`` with every recognisable secret value replaced by ``MASK``."""
    if text.isascii() and "@" not in text:
        lowered = text.lower()
        if not any(hint in lowered for hint in _HINTS):
            return text
    return redact_every_pattern(text)


def redact_every_pattern(text: str) -> str:
    """:func:`redact` without its first look for a hint: every pattern applied."""
    for pattern in _PATTERNS:
        text = pattern.sub(_mask, text)
    return text


def redact_url(url: str) -> str:
    """``url`` with its password and secret query values masked (user name and host kept)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return redact(url)
    if password is not None:
        userinfo, _, hostport = parts.netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        parts = parts._replace(netloc=f"{user}:{MASK}@{hostport}")
    return redact(parts.geturl())


def is_sensitive_key(key: str) -> bool:
    """Whether a mapping key or header name names a secret (``Authorization``, ``db_password``)."""
    lowered = key.strip().lower()
    if lowered in _HEADER_NAMES:
        return True
    squashed = lowered.replace("-", "_")
    return squashed.endswith(_SECRET_SUFFIXES) or squashed.replace("_", "").endswith(_SECRET_SUFFIXES)


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return redact_mapping(value)
    if isinstance(value, list | tuple):
        return type(value)(_redact_value(item) for item in value)
    return value


def redact_mapping(mapping: Mapping[Any, Any]) -> dict[Any, Any]:
    """A copy of ``mapping`` (nested) with secret-named values masked and strings redacted."""
    out: dict[Any, Any] = {}
    for key, value in mapping.items():
        secret = isinstance(key, str) and is_sensitive_key(key) and value not in (None, "")
        out[key] = MASK if secret else _redact_value(value)
    return out


class RedactingFilter(logging.Filter):
    """A logging filter that masks secrets in the fully formatted message."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Replace the record's message with its redacted form; never drops a record."""
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken log call must not break the caller
            return True
        record.msg, record.args = redact(message), ()
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Add a :class:`RedactingFilter` to every handler of ``logger`` (default: root), once."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


def mask_setting_url(value: str, *, hide_path: bool = False) -> str:
    """A settings URL with its whole user info, secret-looking query values and (optionally) path masked.

    Stricter than :func:`redact_url`, which keeps user names: a settings URL's user name may
    itself be a token.
    """
    try:
        parts = urlsplit(value)
    except ValueError:  # malformed (e.g. an unclosed IPv6 bracket): mask it if it may hold a secret
        return MASK if "@" in value else value
    if not parts.scheme or not parts.netloc:
        return value
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user = userinfo.partition(":")[0] if parts.password is not None else ""
        netloc = f"{user}:{MASK}@{host}"
    query = "&".join(_redact_param(pair) for pair in parts.query.split("&")) if parts.query else ""
    path = f"/{MASK}" if hide_path and parts.path not in ("", "/") else parts.path
    return urlunsplit((parts.scheme, netloc, path, query, parts.fragment))


def _redact_param(pair: str) -> str:
    name, sep, _ = pair.partition("=")
    return f"{name}={MASK}" if sep and _SECRET_SETTING_PARAM.search(name) else pair


def redact_settings(data: Any, key: str = "") -> Any:
    """A copy of ``data`` (dumped settings) with every URL-looking string masked; webhook paths too."""
    if isinstance(data, dict):
        return {k: redact_settings(v, str(k)) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [redact_settings(item, key) for item in data]
    if isinstance(data, str):
        return mask_setting_url(data, hide_path=key.endswith("webhook_url"))
    return data
