"""Celery's own message signing, switched on by ``broker.signing`` (see ``deploy/signing.md``).

With signing on, every message a process sends is serialised by Celery's ``auth``
serializer (JSON signed with the process's RSA key) and every consumer accepts only
``auth`` content whose signature verifies against a certificate in ``cert_store``. An
unsigned message, or one whose body was changed after signing, is refused by the consumer
before any task code runs.

Celery keeps serializers in one registry per process, so enabling signing affects every app
of the process; unstuck runs one role per process, and every role reads the same settings.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from workers.errors import ConfigError
from workers.settings import SigningSettings

__all__ = ["apply_signing", "signing_config"]

AUTH_SERIALIZER = "auth"


def signing_config(signing: SigningSettings) -> dict[str, Any]:
    """The Celery settings that sign every task and accept only signed ones (empty when off)."""
    if not signing.enabled:
        return {}
    return {
        "task_serializer": AUTH_SERIALIZER,
        "accept_content": [AUTH_SERIALIZER],
        "security_key": signing.key_file,
        "security_certificate": signing.cert_file,
        "security_cert_store": signing.cert_store,
        "security_key_password": signing.key_password.get_secret_value().encode() or None,
        "security_digest": signing.digest,
    }


def apply_signing(app: Celery, signing: SigningSettings) -> None:
    """Register the signing serializer for ``app`` (configured by :func:`signing_config`).

    Raises:
        ConfigError: the cryptography package is missing, or a key, certificate or store
            cannot be read, is invalid or has expired.
    """
    if not signing.enabled:
        return
    try:
        import cryptography  # noqa: F401  - Celery's signing needs it; say so before Celery does
    except ImportError:
        raise ConfigError(
            [("broker.signing", "needs the cryptography package: pip install 'unstuck[signing]'")]
        ) from None
    try:
        # JSON stays decodable for the content that is not a task (results, events), which
        # Celery loads with its own accept lists; tasks and control messages accept auth only.
        app.setup_security(allowed_serializers={"json"})
    except Exception as exc:  # Celery raises OSError, SecurityError, ValueError, ImproperlyConfigured
        raise ConfigError([("broker.signing", f"{type(exc).__name__}: {exc}")]) from exc
