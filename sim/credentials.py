"""Device names and per-device MQTT credentials of simulated fleets and deployments.

A broker with an ACL identifies a device by its MQTT username, which is also the last level
of its ingress topic (``coco/v1/<deployment>/ingress/<username>``), so a device can publish
only as itself. Per-device passwords are derived from one deployment secret with HMAC-SHA256,
so a fleet of thousands of devices and the broker's password file can be produced from the
secret alone, without a list of passwords to ship around. The secret never appears in a log
line, and a password derived from it reveals nothing about the secret or other devices'
passwords.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from collections.abc import Iterable
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
"""The service accounts of the reference deployment (deploy/mosquitto/acl)."""


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


# -- Mosquitto password files ----------------------------------------------------------------

MOSQUITTO_PBKDF2_ID = 7
"""Mosquitto 2's hash id for PBKDF2-HMAC-SHA512 (``mosquitto_passwd -H sha512-pbkdf2``)."""
MOSQUITTO_SALT_BYTES = 12
MOSQUITTO_DEFAULT_ITERATIONS = 101
_SHA512_BYTES = 64


def _check_username(username: str) -> str:
    # A password-file line is `username:hash`, one per line; Mosquitto splits at the first ':'.
    if not username or any(c in username for c in ":\n\r\x00") or len(username.encode()) > 65535:
        raise ValueError(f"invalid MQTT username for a password file: {username!r}")
    return username


def mosquitto_password_line(
    username: str,
    password: str,
    *,
    salt: bytes | None = None,
    iterations: int = MOSQUITTO_DEFAULT_ITERATIONS,
) -> str:
    """One line of a Mosquitto 2 password file, as ``mosquitto_passwd`` writes it:
    ``username:$7$<iterations>$<base64 salt>$<base64 PBKDF2-HMAC-SHA512>`` (no newline).

    ``salt`` defaults to 12 random bytes (Mosquitto's length); the hash is the 64-byte
    PBKDF2-HMAC-SHA512 of the UTF-8 password under the raw salt bytes.
    """
    _check_username(username)
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if salt is None:
        salt = secrets.token_bytes(MOSQUITTO_SALT_BYTES)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, _SHA512_BYTES)
    return (
        f"{username}:${MOSQUITTO_PBKDF2_ID}${iterations}$"
        f"{base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"
    )


def verify_mosquitto_password_line(line: str, password: str) -> bool:
    """Whether ``password`` matches a ``$7$`` (PBKDF2-HMAC-SHA512) password-file line."""
    _, _, hashed = line.strip().partition(":")
    parts = hashed.split("$")
    if len(parts) != 5 or parts[0] or parts[1] != str(MOSQUITTO_PBKDF2_ID):
        raise ValueError("not a Mosquitto PBKDF2-HMAC-SHA512 ($7$) password line")
    iterations, salt, expected = int(parts[2]), base64.b64decode(parts[3]), parts[4]
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, _SHA512_BYTES)
    return hmac.compare_digest(base64.b64encode(digest).decode(), expected)


def mosquitto_password_file(
    accounts: Iterable[tuple[str, str]], *, iterations: int = MOSQUITTO_DEFAULT_ITERATIONS
) -> str:
    """A whole password file for ``(username, password)`` pairs; duplicate names refused."""
    lines: list[str] = []
    seen: set[str] = set()
    for username, password in accounts:
        if username in seen:
            raise ValueError(f"duplicate MQTT username {username!r}")
        seen.add(username)
        lines.append(mosquitto_password_line(username, password, iterations=iterations))
    return "".join(line + "\n" for line in lines)


def write_private_file(path: Path, text: str, *, owner: tuple[int, int] | None = None) -> None:
    """Atomically replace ``path`` with ``text``, mode 0600 (and ``owner`` uid, gid if given:
    a broker that drops to its own user must still be able to read its password file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    if owner is not None:
        os.chown(tmp, *owner)
    os.replace(tmp, path)
