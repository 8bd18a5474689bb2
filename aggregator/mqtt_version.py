"""Which MQTT protocol version the aggregator speaks: 5, 3.1.1, or whichever the broker
accepts (``auto``: MQTT 5, and MQTT 3.1.1 for the rest of the process once the broker
refuses version 5 with CONNACK reason 0x84, or return code 1 in the 3.1.1 form).

The same contract as the shared ``edge.mqtt_version`` the other commands use; this module
gives way to it when that lands.
"""

from __future__ import annotations

import logging
from typing import Literal

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
    """Whether a CONNACK code (an int, or a reason-code object with ``value``) says the
    broker does not speak the protocol version that was asked for."""
    value = getattr(code, "value", code)
    return value in (UNSUPPORTED_PROTOCOL_VERSION_5, UNACCEPTABLE_PROTOCOL_VERSION_311)


class VersionChoice:
    """The version to connect with next, negotiated once per process for ``auto``."""

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
