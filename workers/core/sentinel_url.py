"""Celery's spelling of a Sentinel-managed Redis, read once for every role.

``redis.url`` may list the Sentinels as Celery and kombu do::

    sentinel://:password@h1:26379/0;sentinel://h2:26379;sentinel://h3:26379

Each part names one Sentinel (host and port). A password or database in a part is the
*primary's* (as kombu reads it), not the Sentinels'; the parts must agree on them. The
primary's name comes from ``redis.sentinel_master``. Pure code: nothing here connects.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

__all__ = ["SENTINEL_SCHEME", "SentinelAccess", "SentinelUrl", "is_sentinel_url", "parse_sentinel_url"]

SENTINEL_SCHEME = "sentinel"
_DEFAULT_PORT = 26379


@dataclass(frozen=True)
class SentinelUrl:
    """The Sentinels of one ``sentinel://`` list and what it says about the primary."""

    nodes: tuple[tuple[str, int], ...]
    #: The primary's database and password (kombu reads them from the URL the same way).
    db: int
    password: str | None
    username: str | None


@dataclass(frozen=True)
class SentinelAccess:
    """Everything a client needs to follow the primary: the list, its name, the Sentinels' auth."""

    url: SentinelUrl
    master: str
    #: The Sentinels' own password (``requirepass`` in sentinel.conf); None when they have none.
    sentinel_password: str | None = None
    tls: bool = False
    #: How often a process asks the Sentinels whether the primary moved (redis.primary_check_interval_ms).
    primary_check_interval_s: float = 0.5


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` (one part or a ``;`` list) uses the ``sentinel://`` scheme anywhere."""
    return any(part.strip().lower().startswith(f"{SENTINEL_SCHEME}://") for part in url.split(";"))


def parse_sentinel_url(url: str) -> SentinelUrl:
    """Read a ``sentinel://`` list; raises ``ValueError`` naming what is wrong and how to write it."""
    parts = [part.strip() for part in url.split(";") if part.strip()]
    if not parts:
        raise ValueError("an empty Sentinel list: write sentinel://host:26379;sentinel://host2:26379")
    schemes = {urlsplit(part).scheme.lower() for part in parts}
    if schemes != {SENTINEL_SCHEME}:
        found = ", ".join(sorted(s or "(none)" for s in schemes))
        raise ValueError(
            f"mixed schemes in a Sentinel list ({found}): every part must be sentinel://host:port"
        )
    read = [_part(part) for part in parts]
    dbs = {part.db for part in read if part.db is not None}
    passwords = {part.password for part in read if part.password is not None}
    usernames = {part.username for part in read if part.username is not None}
    if len(dbs) > 1 or len(passwords) > 1 or len(usernames) > 1:
        raise ValueError(
            "the parts of a Sentinel list disagree on the primary's database or password: "
            "give them once, in the first part (sentinel://:password@h1:26379/0;sentinel://h2:26379)"
        )
    nodes = tuple(part.node for part in read)
    if len(set(nodes)) != len(nodes):
        raise ValueError("a Sentinel is listed twice in redis.url")
    # A part without credentials or database has the ones another part states.
    return SentinelUrl(
        nodes=nodes,
        db=next(iter(dbs), 0),
        password=next(iter(passwords), None),
        username=next(iter(usernames), None),
    )


@dataclass(frozen=True)
class _Part:
    node: tuple[str, int]
    db: int | None
    password: str | None
    username: str | None


def _part(part: str) -> _Part:
    split = urlsplit(part)
    if not split.hostname:
        raise ValueError(f"a Sentinel without a host in {part!r}: write sentinel://host:26379")
    try:
        port = split.port or _DEFAULT_PORT
    except ValueError:
        raise ValueError(f"a Sentinel port that is not a number in {part!r}") from None
    path = split.path.strip("/")
    if path and not path.isdigit():
        raise ValueError(f"the database in {part!r} must be a number, as in sentinel://h1:26379/0")
    if split.query:
        raise ValueError(
            f"options in a Sentinel URL ({split.query!r}) are not read: use the redis.sentinel_* settings"
        )
    password = unquote(split.password) if split.password else None
    username = unquote(split.username) if split.username else None
    return _Part((split.hostname, port), int(path) if path else None, password, username)
