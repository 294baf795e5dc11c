"""Test helpers for signed broker messages: a throwaway key and certificate, raw publishing.

The messages published here bypass Celery's sending side on purpose: an unsigned body, or a
signed body changed after signing, exactly as someone with write access to the broker could.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import Celery
from celery.security.certificate import Certificate
from celery.security.key import PrivateKey
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from kombu.serialization import registry  # type: ignore[attr-defined]  # absent from the stubs

from workers.celery_edge.names import INVOKE_TASK

SEPARATOR = b"\x00\x01"  # celery.security.serialization.DEFAULT_SEPARATOR


@dataclass(frozen=True)
class SigningFiles:
    """A key, its self-signed certificate, and a store directory trusting it."""

    key: Path
    cert: Path
    store: Path

    def env(self) -> dict[str, str]:
        return {
            "UNSTUCK_BROKER__SIGNING__KEY_FILE": str(self.key),
            "UNSTUCK_BROKER__SIGNING__CERT_FILE": str(self.cert),
            "UNSTUCK_BROKER__SIGNING__CERT_STORE": str(self.store),
        }


def make_signing_files(folder: Path, name: str = "unstuck-test") -> SigningFiles:
    """Generate an RSA key and a self-signed certificate valid for a day, as deploy/signing.md does."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    files = SigningFiles(folder / f"{name}.key", folder / f"{name}.pem", folder / "trusted")
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.store.mkdir(exist_ok=True)
    (files.store / files.cert.name).write_bytes(files.cert.read_bytes())
    return files


@contextlib.contextmanager
def kombu_registry_restored() -> Iterator[None]:
    """Undo what Celery's setup_security does to this process's serializer registry."""
    saved = (
        dict(registry._encoders),
        dict(registry._decoders),
        set(registry._disabled_content_types),
        registry._default_encode,
        registry._default_content_type,
        registry._default_content_encoding,
        dict(registry.type_to_name),
        dict(registry.name_to_type),
    )
    try:
        yield
    finally:
        registry._encoders, registry._decoders = saved[0], saved[1]
        registry._disabled_content_types = saved[2]
        registry._default_encode, registry._default_content_type = saved[3], saved[4]
        registry._default_content_encoding = saved[5]
        registry.type_to_name, registry.name_to_type = saved[6], saved[7]


def sign(files: SigningFiles, body: bytes) -> bytes:
    """``body`` (JSON bytes) packed as the auth serializer does, signed with ``files``' key."""
    key, cert = PrivateKey(files.key.read_text()), Certificate(files.cert.read_text())
    signature = key.sign(body, hashes.SHA256())  # type: ignore[arg-type]  # the stubs say str
    fields = [cert.get_id().encode(), signature, b"application/json", b"utf-8", body]
    fields[0], fields[1] = base64.b64encode(fields[0]), base64.b64encode(fields[1])
    return base64.b64encode(SEPARATOR.join(fields))


def tamper(signed: bytes, body: bytes) -> bytes:
    """A signed payload whose body was replaced by ``body``, the signature kept."""
    fields = base64.b64decode(signed).split(SEPARATOR, maxsplit=4)
    fields[4] = body
    return base64.b64encode(SEPARATOR.join(fields))


def invoke_body(
    app: Celery, job: dict[str, Any], task_id: str
) -> tuple[dict[str, Any], dict[str, Any], bytes]:
    """Headers, properties and JSON body of a protocol-2 invoke message for ``job``."""
    message = app.amqp.as_task_v2(task_id, INVOKE_TASK, kwargs={"job": job})
    return message.headers, message.properties, json.dumps(message.body).encode()


def publish_raw(
    app: Celery,
    queue: str,
    headers: dict[str, Any],
    properties: dict[str, Any],
    payload: bytes,
    *,
    signed: bool,
) -> None:
    """Publish a message by hand onto ``queue``: JSON when not ``signed``, else an auth payload."""
    with app.producer_or_acquire() as producer:
        producer.publish(
            payload,
            exchange="",
            routing_key=queue,
            headers=headers,
            content_type="application/data" if signed else "application/json",
            content_encoding="utf-8",
            **properties,
        )
