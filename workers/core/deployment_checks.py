"""What a production deployment leaves open, found from its URLs (``unstuck config check``).

Redis holds the task queue, the ledger and the results, so whoever can write to it can queue
calls and answer them. These checks name what is missing from the recommended setup in
``deploy/README.md``: a Redis ACL user with a password, TLS to a Redis (or broker) that is
not on this host, and signed messages. Nothing is checked for the embedded redis-server of
``unstuck up`` (empty ``redis.url``): it listens on loopback for one user's session.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from workers.core.config_checks import ConfigWarning

__all__ = ["check_deployment", "check_endpoint"]

# The TLS scheme of each plain scheme a Redis or AMQP URL may use.
_TLS_SCHEME = {"redis": "rediss", "amqp": "amqps", "pyamqp": "amqps"}
_SECURED_SCHEMES = {"rediss", "amqps", "unix", "redis+socket"}


def _loopback(host: str | None) -> bool:
    if not host or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: assume another host


def check_endpoint(path: str, url: str) -> list[ConfigWarning]:
    """A Redis or AMQP URL without its own user and password, or in clear text to another host."""
    try:
        parts = urlsplit(url)
        parts.hostname  # noqa: B018 - parsed lazily: a bracket without its pair raises here
    except ValueError as exc:
        return [ConfigWarning(path, f"not a URL unstuck can read ({exc})")]
    if parts.scheme not in _TLS_SCHEME and parts.scheme not in _SECURED_SCHEMES:
        return []
    found: list[ConfigWarning] = []
    if not parts.password:
        found.append(
            ConfigWarning(
                path,
                "no password: anyone who reaches this server can queue tool calls and write their "
                "results; give unstuck its own ACL user (redis://unstuck:PASSWORD@host:6379/0)",
            )
        )
    elif not parts.username and parts.scheme.startswith("redis"):
        found.append(
            ConfigWarning(
                path,
                "the password of Redis's default user: create an ACL user for unstuck limited to "
                "its keys and channels (deploy/README.md, 'Production checklist')",
            )
        )
    tls = _TLS_SCHEME.get(parts.scheme)
    if tls and not _loopback(parts.hostname):
        found.append(
            ConfigWarning(
                path,
                f"{parts.scheme}:// to another host sends passwords, tool arguments and results in "
                f"clear text; use {tls}:// (TLS)",
            )
        )
    return found


def check_deployment(*, redis_url: str, broker_url: str, signing_enabled: bool) -> list[ConfigWarning]:
    """Every missing safeguard of a deployment on its own Redis (none for the embedded one).

    Args:
        redis_url: ``redis.url``; empty means the embedded redis-server of ``unstuck up``.
        broker_url: ``broker.url`` as configured; empty means ``redis.url``.
        signing_enabled: whether ``broker.signing`` is set.
    """
    if not redis_url:
        return []
    found = check_endpoint("unstuck.redis.url", redis_url)
    if broker_url and broker_url != redis_url:
        found += check_endpoint("unstuck.broker.url", broker_url)
    if not signing_enabled:
        found.append(
            ConfigWarning(
                "unstuck.broker.signing",
                "task messages are not signed: whoever can write to the broker can replay or alter "
                "them (workers still run only registered calls); set key_file, cert_file and "
                "cert_store (deploy/signing.md)",
            )
        )
    return found
