"""``unstuck flower``: start Flower against our broker, with basic auth required off loopback.

Flower's web UI can revoke and terminate tasks and shut workers down, so it is refused on a
non-loopback address unless basic auth is given (``--basic-auth`` or ``FLOWER_BASIC_AUTH``).
The credentials reach Flower through its ``FLOWER_BASIC_AUTH`` environment variable, never
its command line, so ``ps`` does not show them. Flower exempts ``/metrics`` and
``/healthcheck`` from auth.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import Any, Final

from workers.cli.launch import flower_argv
from workers.errors import ConfigError
from workers.servers.auth import is_loopback
from workers.settings import load_settings, process_environment

__all__ = ["BASIC_AUTH_ENV", "flower_argv", "flower_env", "is_loopback", "parse_basic_auth", "register"]

BASIC_AUTH_ENV: Final = "FLOWER_BASIC_AUTH"
_EXIT_REFUSED = 2


def register(subparsers: Any) -> None:
    """Add the ``flower`` sub-command."""
    flower = subparsers.add_parser(
        "flower",
        help="start Flower (Celery monitoring) against the configured broker",
        description="Start Flower against the configured broker. Binding to a non-loopback address "
        f"requires basic auth, taken only from --basic-auth or the {BASIC_AUTH_ENV} environment "
        "variable (USER:PASS, comma-separated for several users).",
    )
    flower.add_argument("--port", type=int, default=5555, help="HTTP port (default 5555)")
    flower.add_argument("--address", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    flower.add_argument(
        "--basic-auth",
        metavar="USER:PASS[,USER:PASS]",
        help=f"required off loopback; default: ${BASIC_AUTH_ENV}. Passed to Flower via its environment",
    )
    flower.set_defaults(func=_flower)


def parse_basic_auth(value: str) -> str:
    """``value`` when every comma-separated entry is ``user:password`` with both parts non-empty.

    Raises:
        ConfigError: naming the malformed entry's position (never its password).
    """
    for index, entry in enumerate(value.split(",")):
        user, sep, password = entry.partition(":")
        if not (sep and user.strip() and password):
            raise ConfigError([("--basic-auth", f"entry {index + 1} must be USER:PASS")])
    return value


def flower_env(address: str, basic_auth: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """Flower's environment: ``environ`` plus the credentials, from the flag or ``FLOWER_BASIC_AUTH``.

    Raises:
        ConfigError: when the address is not loopback and there are no credentials, or they
            are malformed.
    """
    auth = basic_auth if basic_auth is not None else environ.get(BASIC_AUTH_ENV) or None
    env = dict(environ)
    if auth is None:
        if not is_loopback(address):
            raise ConfigError(
                [
                    (
                        "--address",
                        f"{address or '<all interfaces>'} is not loopback: "
                        f"give --basic-auth USER:PASS or set {BASIC_AUTH_ENV}",
                    )
                ]
            )
        env.pop(BASIC_AUTH_ENV, None)
        return env
    env[BASIC_AUTH_ENV] = parse_basic_auth(auth)
    return env


def _flower(args: argparse.Namespace) -> int:
    try:
        settings = load_settings()
        if not settings.broker_url:
            raise ConfigError(
                [("redis.url", "no broker configured: set UNSTUCK_REDIS__URL (or run `unstuck up`)")]
            )
        env = flower_env(args.address, args.basic_auth, process_environment())
    except ConfigError as exc:
        path, reason = exc.problems[0] if exc.problems else ("", str(exc))
        print(f"unstuck flower: {path}: {reason}", file=sys.stderr)
        return _EXIT_REFUSED
    argv = flower_argv(args.port, args.address)
    os.execve(argv[0], argv, env)
    return 0  # not reached: execve replaces this process
