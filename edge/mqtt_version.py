"""Which MQTT protocol version to speak: 5, 3.1.1, or whichever the broker accepts.

Every command that connects takes ``--mqtt-version auto|5|3.1.1``. ``auto`` (the default)
connects with MQTT 5 and, if the broker refuses that protocol version, connects again with
MQTT 3.1.1 and keeps it for the rest of the process (:class:`VersionChoice`). A refusal is
an explicit answer, never a guess from a lost connection:

* a CONNACK with MQTT 5 reason code ``0x84`` (*Unsupported Protocol Version*), or
* a CONNACK in 3.1.1 form with return code ``1`` (*unacceptable protocol version*), which is
  what a 3.1.1-only broker sends back to an MQTT 5 CONNECT (NATS's MQTT listener does;
  paho reports it as reason ``0x84``).

What each version gives the services (docs/brokers.md has the per-broker detail):

* both: QoS 1, retained messages, a persistent session (MQTT 5 ``clean_start=0`` with a
  session expiry interval; MQTT 3.1.1 ``clean_session=0``, which the broker keeps until a
  clean connection with the same client id);
* MQTT 5 only: Maximum Packet Size (the shuffler's ingest refuses large messages at the
  broker; on 3.1.1 the broker's own limit applies, and every receiver checks lengths before
  anything else), session expiry, reason codes on PUBACK (a refused publish is visible to
  a device), Retain-As-Published, and a DISCONNECT with reason ``0x8E`` when another client
  takes a session over (on 3.1.1 only the services' leases can tell, and they do).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import Literal

__all__ = [
    "MQTT_VERSIONS",
    "MqttVersion",
    "Negotiated",
    "VersionChoice",
    "check_mqtt_version",
    "is_version_refusal",
    "negotiate",
    "probe",
]

logger = logging.getLogger(__name__)

MqttVersion = Literal["auto", "5", "3.1.1"]
Negotiated = Literal["5", "3.1.1"]
MQTT_VERSIONS: tuple[MqttVersion, ...] = ("auto", "5", "3.1.1")
UNSUPPORTED_PROTOCOL_VERSION_5 = 0x84
UNACCEPTABLE_PROTOCOL_VERSION_311 = 1


def check_mqtt_version(value: str) -> MqttVersion:
    """``value`` if it is one of :data:`MQTT_VERSIONS`; :class:`ValueError` otherwise."""
    if value not in MQTT_VERSIONS:
        raise ValueError(f"--mqtt-version must be one of {', '.join(MQTT_VERSIONS)}, got {value!r}")
    return value


def is_version_refusal(code: object) -> bool:
    """Whether a CONNACK code (an int, or a library's reason-code object with ``value``)
    says the broker does not speak the protocol version that was asked for."""
    value = getattr(code, "value", code)
    return value in (UNSUPPORTED_PROTOCOL_VERSION_5, UNACCEPTABLE_PROTOCOL_VERSION_311)


_PROBE_CONNECT = bytes.fromhex("100d00044d5154540502000a000000")
"""An MQTT 5 CONNECT: protocol name MQTT, level 5, clean start, keepalive 10 s, no
properties, an empty client id (the broker assigns one)."""
_DISCONNECT = bytes.fromhex("e000")


async def probe(
    host: str, port: int, *, tls: ssl.SSLContext | None = None, timeout: float = 10.0
) -> Negotiated:
    """Whether the broker at ``host:port`` speaks MQTT 5: ``"5"``, or ``"3.1.1"`` if it
    answers an MQTT 5 CONNECT with a protocol-version refusal (module docs).

    Any other answer, an authentication refusal included, means the broker parsed MQTT 5:
    ``"5"``. Raises :class:`OSError` or :class:`TimeoutError` when the broker cannot be
    reached or does not answer. Library-independent (raw bytes), so each client library
    then connects with the version found."""
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(
            host, port, ssl=tls, server_hostname=host if tls is not None else None
        )
        try:
            writer.write(_PROBE_CONNECT)
            await writer.drain()
            head = await reader.readexactly(2)
            if head[0] >> 4 != 2:  # not a CONNACK
                raise OSError(f"{host}:{port} answered an MQTT CONNECT with packet {head[0]:#x}")
            body = await reader.readexactly(head[1]) if head[1] < 128 else b""
            code = body[1] if len(body) >= 2 else None
            if code is not None and is_version_refusal(code):
                return "3.1.1"
            if code == 0:
                with contextlib.suppress(OSError):
                    writer.write(_DISCONNECT)
                    await writer.drain()
            return "5"
        finally:
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()


async def negotiate(
    requested: MqttVersion,
    host: str,
    port: int,
    *,
    tls: ssl.SSLContext | None = None,
    timeout: float = 10.0,
) -> Negotiated:
    """The version to connect with: ``requested`` itself, or for ``auto`` what
    :func:`probe` finds (logged at INFO when it is 3.1.1)."""
    if requested != "auto":
        return requested
    found = await probe(host, port, tls=tls, timeout=timeout)
    if found == "3.1.1":
        logger.info("%s:%d does not speak MQTT 5; using MQTT 3.1.1", host, port)
    return found


class VersionChoice:
    """The version to connect with next, negotiated once per process for ``auto``.

    ``current`` starts at ``"5"`` for ``auto``; :meth:`refused` moves it to ``"3.1.1"``
    after the broker refused MQTT 5 (and returns whether connecting again makes sense).
    """

    def __init__(self, requested: MqttVersion, *, broker: str = "the broker") -> None:
        self.requested = check_mqtt_version(requested)
        self.broker = broker
        self.current: Negotiated = "3.1.1" if requested == "3.1.1" else "5"

    @property
    def mqtt5(self) -> bool:
        return self.current == "5"

    def refused(self) -> bool:
        """The broker refused :attr:`current`: ``True`` if another version is worth trying
        (``auto`` after an MQTT 5 refusal), ``False`` if the refusal is final."""
        if self.requested == "auto" and self.current == "5":
            self.current = "3.1.1"
            logger.info("%s does not speak MQTT 5; using MQTT 3.1.1", self.broker)
            return True
        return False

    def describe_refusal(self) -> str:
        """A one-line error for a final refusal."""
        if self.requested == "5":
            return (
                f"{self.broker} refused MQTT 5 (unsupported protocol version); it may speak "
                "only MQTT 3.1.1: use --mqtt-version 3.1.1 or auto"
            )
        return f"{self.broker} refused MQTT {self.current} (unsupported protocol version)"
