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

import hashlib
import hmac

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
