"""Device names and the MQTT passwords of devices and services, derived from one secret.

A broker with an ACL identifies a device by its MQTT username, which is also the last level
of its ingress topic (``coco/v1/<deployment>/ingress/<username>``), so a device can publish
only as itself. Per-device passwords are derived from one deployment secret with HMAC-SHA256,
so a fleet of thousands of devices and the broker's password file can be produced from the
secret alone, without a list of passwords to ship around. The secret never appears in a log
line, and a password derived from it reveals nothing about the secret or other devices'
passwords.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from edge.topics import check_name

DEFAULT_PREFIX = "dev-"


def device_id(index: int, prefix: str = DEFAULT_PREFIX) -> str:
    """The name of the ``index``-th simulated device: ``prefix`` + six-digit index."""
    if index < 0:
        raise ValueError(f"device index must be >= 0, got {index}")
    return check_name("device", f"{prefix}{index:06d}")


def device_password(secret: bytes, device: str) -> str:
    """The MQTT password of ``device``: hex HMAC-SHA256 of its name under ``secret`` (32 chars)."""
    if not secret:
        raise ValueError("the credentials secret must not be empty")
    return hmac.new(secret, check_name("device", device).encode(), hashlib.sha256).hexdigest()[:32]


# -- service accounts ------------------------------------------------------------------------

SERVICE_ACCOUNTS = ("shuffler", "aggregator", "announcer")
"""The service accounts of the reference deployment (their roles: :func:`dynsec_config`)."""


def service_password(secret: bytes, service: str) -> str:
    """The MQTT password of service account ``service``, derived from the deployment secret.

    The HMAC input carries a ``service:`` domain tag, so no device name (a plain topic level)
    can ever be given the password of a service account, whatever its prefix.
    """
    if not secret:
        raise ValueError("the credentials secret must not be empty")
    name = check_name("service", service)
    return hmac.new(secret, b"service:" + name.encode(), hashlib.sha256).hexdigest()[:32]


# -- the deployment secret -------------------------------------------------------------------

SECRET_BYTES = 32


def read_secret(path: Path) -> bytes:
    """The deployment secret stored in ``path`` (surrounding whitespace ignored)."""
    secret = path.read_bytes().strip()
    if not secret:
        raise ValueError(f"the credentials secret file {path} is empty")
    return secret


def create_secret(path: Path) -> bytes:
    """Write a fresh random secret (64 hex characters, no newline) to ``path``, mode 0600.

    Refuses to overwrite: replacing the secret changes every device's password.
    """
    secret = secrets.token_hex(SECRET_BYTES).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(secret)
    return secret


# -- private files ---------------------------------------------------------------------------


def write_private_file(path: Path, text: str, *, owner: tuple[int, int] | None = None) -> None:
    """Atomically replace ``path`` with ``text``, mode 0600 (and ``owner`` uid, gid if given:
    a broker that drops to its own user must still be able to read its password file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)  # a stale temporary file left by a crash keeps its old mode otherwise
    with os.fdopen(fd, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    if owner is not None:
        os.chown(tmp, *owner)
    os.replace(tmp, path)
