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

import logging
from typing import Literal

__all__ = [
    "MQTT_VERSIONS",
    "MqttVersion",
    "Negotiated",
    "VersionChoice",
    "check_mqtt_version",
    "is_version_refusal",
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
