"""Who may use a door: bearer tokens (constant-time), and loopback only when there are none."""

from __future__ import annotations

import hmac
import ipaddress

from pydantic import SecretStr

from workers.errors import ConfigError

__all__ = ["bearer_ok", "check_exposure", "is_loopback"]


def is_loopback(address: str) -> bool:
    """Whether ``address`` only accepts local connections (``""`` and ``0.0.0.0`` do not)."""
    if address.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name may resolve to anything: treat it as public


def check_exposure(host: str, tokens: tuple[SecretStr, ...], *, door: str) -> None:
    """Refuse to bind a non-loopback ``host`` without tokens.

    Raises:
        ConfigError: naming the setting that fixes it.
    """
    if tokens or is_loopback(host):
        return
    raise ConfigError(
        [
            (
                "api.tokens",
                f"{door} on {host!r} would be open to anyone: set UNSTUCK_API__TOKENS or bind loopback",
            )
        ]
    )


def bearer_ok(authorization: str | None, tokens: tuple[SecretStr, ...]) -> bool:
    """Whether an ``Authorization`` header carries one of ``tokens`` (always true without tokens).

    Every token is compared, in constant time, so the time taken says nothing about which
    one nearly matched.
    """
    if not tokens:
        return True
    scheme, _, presented = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not presented:
        return False
    candidate = presented.strip().encode()
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(candidate, token.get_secret_value().encode())
    return matched
