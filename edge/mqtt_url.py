"""Broker URLs shared by every component: ``mqtt://host[:port]`` or ``mqtts://host[:port]``."""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import urlsplit

SCHEMES = {"mqtt": (False, 1883), "mqtts": (True, 8883)}


class BrokerAddress(NamedTuple):
    host: str
    port: int
    tls: bool


def parse_broker_url(url: str) -> BrokerAddress:
    """Host, port (1883, or 8883 for ``mqtts``) and whether to use TLS; ``ValueError`` names
    the problem for anything else (another scheme, no host, a bad port, a path or query)."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ValueError(f"broker must be mqtt://host:port or mqtts://host:port, got {url!r}")
    tls, default_port = SCHEMES[parts.scheme]
    try:
        port = parts.port or default_port
    except ValueError as exc:
        raise ValueError(f"broker URL {url!r} has an invalid port") from exc
    if not parts.hostname:
        raise ValueError(f"broker URL {url!r} has no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"broker URL {url!r} must not have a path or query")
    return BrokerAddress(parts.hostname, port, tls)
