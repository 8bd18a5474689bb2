"""Broker URLs shared by every component: ``mqtt://host[:port]`` or ``mqtts://host[:port]``,
or a comma-separated list of them (the nodes of a broker cluster)."""

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


def parse_broker_urls(value: str) -> tuple[BrokerAddress, ...]:
    """The addresses of ``value``: one broker URL, or the URLs of a cluster's nodes separated
    by commas (``mqtt://10.0.0.1:1883,mqtt://10.0.0.2:1883``), all with the same scheme.
    A client connects to the first and, each time a connection is lost or refused, to the
    next (:class:`BrokerList`): MQTT has no redirect, so a client of a broker cluster must
    know more than one node."""
    urls = [part.strip() for part in value.split(",")]
    if not all(urls):
        raise ValueError(f"broker list {value!r} has an empty entry")
    addresses = tuple(parse_broker_url(url) for url in urls)
    if len({a.tls for a in addresses}) > 1:
        raise ValueError(f"broker list {value!r} mixes mqtt:// and mqtts://")
    if len(set(addresses)) != len(addresses):
        raise ValueError(f"broker list {value!r} names a node twice")
    return addresses


class BrokerList:
    """The nodes of ``--broker`` in turn: :attr:`current` until :meth:`failed` moves on."""

    def __init__(self, value: str) -> None:
        self.addresses = parse_broker_urls(value)
        self._index = 0

    @property
    def current(self) -> BrokerAddress:
        return self.addresses[self._index]

    @property
    def tls(self) -> bool:
        return self.addresses[0].tls

    def failed(self) -> BrokerAddress:
        """The connection to :attr:`current` was lost or refused: the next node."""
        self._index = (self._index + 1) % len(self.addresses)
        return self.current

    def __len__(self) -> int:
        return len(self.addresses)
