"""A device publisher's link to its broker: the paho client, the spec announcement, PUBACKs.

:class:`BrokerLink` is the connection half of :class:`~edge.publisher.DevicePublisher`: it
connects to the broker (paho-mqtt; MQTT 5, or 3.1.1 where the broker refuses 5 or on
request: :mod:`edge.mqtt_version`), learns the mechanism from the deployment's retained
spec announcement (or is given it, and then checks that it matches the announcement),
keeps watching the announcement, and publishes a report and waits for its PUBACK. What a
device sends, and when, is the publisher's (:mod:`edge.publisher`).

The MQTT client id is the device id (the broker binds client ids to accounts: the device's
user name is its id too). The device id is in the topic and the client id only, never in the
payload (the shuffler strips topics before anything reaches the aggregator), and it is logged
at DEBUG level only.

Reconnection is paho's: ``loop_start`` runs a network thread that reconnects with
exponential backoff (``reconnect_delay_set``) and re-subscribes to the spec topic on every
connection (the broker re-sends the retained announcement). A publish while disconnected
waits up to ``publish_timeout`` for the connection to come back, charging nothing before it
does.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edge.announce import decode_announcement
from edge.errors import CocoError, SpecError
from edge.mqtt_url import parse_broker_url
from edge.mqtt_version import MQTT_VERSIONS, MqttVersion, VersionChoice, is_version_refusal
from edge.rounds import check_round_seconds
from edge.spec import MechanismSpec
from edge.topics import check_name, spec_topic

__all__ = ["ANNOUNCEMENT_GRACE", "BrokerLink", "PublisherConfig", "PublisherError"]

logger = logging.getLogger("edge.publisher")  # the publisher's logger (edge/publisher.py)

ANNOUNCEMENT_GRACE = 0.5
"""Seconds to wait after SUBACK for a retained announcement when the spec is given."""


class PublisherError(CocoError):
    """The broker could not be reached, or did not acknowledge a report in time."""


@dataclass(frozen=True, kw_only=True)
class PublisherConfig:
    """How a device reaches its broker.

    ``broker`` is ``mqtt://host[:port]`` (default port 1883) or ``mqtts://host[:port]``
    (TLS, default port 8883; ``ca_file`` overrides the system trust store, ``cert_file`` and
    ``key_file`` give a client certificate). ``client_id`` defaults to the device id (what a
    broker that binds client ids to user names expects). Timeouts are in seconds;
    ``reconnect_min_delay``
    and ``reconnect_max_delay`` bound paho's exponential reconnect backoff (whole seconds,
    as paho takes them).
    """

    broker: str
    deployment: str
    device_id: str
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    qos: int = 1
    protocol: MqttVersion = "auto"
    """``auto`` tries MQTT 5 and falls back to 3.1.1 if the broker refuses it."""
    client_id: str | None = None
    keepalive: int = 30
    connect_timeout: float = 10.0
    publish_timeout: float = 10.0
    spec_timeout: float = 10.0
    reconnect_min_delay: int = 1
    reconnect_max_delay: int = 30
    host: str = field(init=False)
    port: int = field(init=False)
    tls: bool = field(init=False)

    def __post_init__(self) -> None:
        host, port, tls = parse_broker_url(self.broker)
        check_name("deployment", self.deployment)
        check_name("device", self.device_id)
        if self.qos not in (0, 1, 2):
            raise ValueError(f"qos must be 0, 1 or 2, got {self.qos}")
        if self.protocol not in MQTT_VERSIONS:
            raise ValueError(f"protocol must be one of {MQTT_VERSIONS}, got {self.protocol!r}")
        for name in ("connect_timeout", "publish_timeout", "spec_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 1 <= self.reconnect_min_delay <= self.reconnect_max_delay:
            raise ValueError(
                "need 1 <= reconnect_min_delay <= reconnect_max_delay, got "
                f"{self.reconnect_min_delay} and {self.reconnect_max_delay}"
            )
        if self.key_file and not self.cert_file:
            raise ValueError("key_file needs cert_file")
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "port", port)
        object.__setattr__(self, "tls", tls or self.ca_file is not None)

    def __repr__(self) -> str:
        # Keep the password (and, at INFO level, the device id) out of logs and tracebacks.
        return (
            f"PublisherConfig(broker={self.broker!r}, deployment={self.deployment!r}, "
            f"qos={self.qos}, protocol={self.protocol!r})"
        )


class BrokerLink:
    """The connection, the announcement and the acknowledgements of one device's
    publisher (module docstring); thread-safe: paho's network thread calls back into it."""

    def __init__(
        self,
        config: PublisherConfig,
        *,
        spec: MechanismSpec | None = None,
        round_seconds: int | None = None,
    ) -> None:
        if round_seconds is not None:
            check_round_seconds(round_seconds)
        self.config = config
        self._given_spec = spec
        self._given_round_seconds = round_seconds
        self._version = VersionChoice(config.protocol, broker=config.broker)
        self._version_refused = False
        self._spec_topic = spec_topic(config.deployment)

        self._cond = threading.Condition()
        self._connected = False
        self._connect_error: str | None = None
        self._spec_sub_mid: int | None = None
        self._subscribed = False
        self._announcement: dict[str, Any] | None = None
        self._announcement_error: str | None = None
        self._announcements_seen = 0
        self._acks: dict[int, ReasonCode | None] = {}
        self._abandoned: set[int] = set()

        self._client: mqtt.Client | None = None
        self._spec: MechanismSpec | None = None

    @property
    def spec(self) -> MechanismSpec:
        """The spec in force (after :meth:`start`)."""
        if self._spec is None:
            raise PublisherError("the publisher is not started")
        return self._spec

    @property
    def announcement(self) -> dict[str, Any] | None:
        """The latest valid announcement seen (``decode_announcement`` output), if any."""
        with self._cond:
            return self._announcement

    @property
    def round_seconds(self) -> int:
        """The round length in force: the latest announcement's, else the given one."""
        with self._cond:
            announcement = self._announcement
        if announcement is not None:
            announced: int = announcement["round_seconds"]
            return announced
        if self._given_round_seconds is None:
            raise PublisherError("no announcement and no round_seconds: the round is unknown")
        return self._given_round_seconds

    @property
    def connected(self) -> bool:
        with self._cond:
            return self._connected

    @property
    def mqtt_version(self) -> str:
        """The MQTT version in use (``"5"`` or ``"3.1.1"``)."""
        return self._version.current

    def close(self) -> None:
        """Disconnect and stop the network thread (idempotent)."""
        client, self._client = self._client, None
        if client is None:
            return
        try:
            client.disconnect()
        finally:
            client.loop_stop()
            with self._cond:
                self._connected = False
                self._cond.notify_all()

    def _connect(self) -> None:
        """Connect and resolve the spec (:meth:`_resolve_spec`), again with MQTT 3.1.1 if the
        broker refuses 5 under ``auto``; closed again when that fails."""
        if self._client is not None:
            raise PublisherError("the publisher is already started")
        while True:
            self._client = self._make_client()
            try:
                self._connect_and_resolve()
            except PublisherError:
                refused = self._version_refused
                self.close()
                if refused and self._version.refused():
                    continue  # the broker speaks only 3.1.1: connect again with it
                if refused:
                    raise PublisherError(self._version.describe_refusal()) from None
                raise
            except BaseException:
                self.close()
                raise
            break

    def _make_client(self) -> mqtt.Client:
        cfg = self.config
        protocol = (
            MQTTProtocolVersion.MQTTv5 if self._version.mqtt5 else MQTTProtocolVersion.MQTTv311
        )
        client = mqtt.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=cfg.device_id if cfg.client_id is None else cfg.client_id,
            protocol=protocol,
        )
        client.enable_logger(logging.getLogger(f"{logger.name}.paho"))
        if cfg.username is not None:
            client.username_pw_set(cfg.username, cfg.password)
        if cfg.tls:
            client.tls_set(ca_certs=cfg.ca_file, certfile=cfg.cert_file, keyfile=cfg.key_file)
        client.connect_timeout = cfg.connect_timeout
        client.reconnect_delay_set(cfg.reconnect_min_delay, cfg.reconnect_max_delay)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        with self._cond:
            self._version_refused = False
            self._connect_error = None
        return client

    def _connect_and_resolve(self) -> None:
        cfg = self.config
        client = self._client
        assert client is not None
        client.connect_async(cfg.host, cfg.port, keepalive=cfg.keepalive)
        client.loop_start()
        self._wait_connected(cfg.connect_timeout)
        self._spec = self._resolve_spec()

    def _send(
        self, client: mqtt.Client, topic: str, payload: bytes, round_: int, deadline: float
    ) -> None:
        info = client.publish(topic, payload, qos=self.config.qos)
        if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
            # NO_CONN: paho keeps a QoS > 0 message queued and sends it after reconnecting.
            raise PublisherError(
                f"report for round {round_} was not queued: {mqtt.error_string(info.rc)}"
            )
        mid = info.mid
        timeout = max(deadline - time.monotonic(), 0.0)
        with self._cond:
            if not self._cond.wait_for(lambda: mid in self._acks, timeout=timeout):
                self._abandoned.add(mid)
                raise PublisherError(
                    f"broker did not acknowledge the report for round {round_} within "
                    f"{self.config.publish_timeout:g} s (the budget is spent; the client "
                    "may still deliver it later)"
                )
            reason = self._acks.pop(mid)
        if reason is not None and reason.is_failure:
            raise PublisherError(f"broker rejected the report for round {round_}: {reason}")

    def _wait_connected(self, timeout: float) -> None:
        with self._cond:
            if (
                self._cond.wait_for(
                    lambda: self._connected or self._version_refused, timeout=timeout
                )
                and self._connected
            ):
                return
            detail = f" ({self._connect_error})" if self._connect_error else ""
        raise PublisherError(f"not connected to {self.config.broker} within {timeout:g} s{detail}")

    def _resolve_spec(self) -> MechanismSpec:
        given = self._given_spec
        cfg = self.config
        with self._cond:
            if not self._cond.wait_for(lambda: self._subscribed, timeout=cfg.connect_timeout):
                raise PublisherError(f"no SUBACK for {self._spec_topic} from {cfg.broker}")
            wait = min(ANNOUNCEMENT_GRACE, cfg.spec_timeout) if given else cfg.spec_timeout
            self._cond.wait_for(
                lambda: self._announcement is not None or self._announcement_error is not None,
                timeout=wait,
            )
            announcement, error = self._announcement, self._announcement_error
        if error is not None and announcement is None:
            raise SpecError(f"the spec announcement on {self._spec_topic} is invalid: {error}")
        if announcement is None:
            if given is not None:
                if self._given_round_seconds is None:
                    raise PublisherError(
                        f"no spec announcement on {self._spec_topic}: the round length is "
                        "unknown (give round_seconds with the spec)"
                    )
                logger.info("no spec announcement retained; using the given spec")
                return given
            raise PublisherError(
                f"no spec announcement on {self._spec_topic} within {cfg.spec_timeout:g} s"
            )
        announced = MechanismSpec.from_dict(announcement["spec"])
        if given is not None and given.fingerprint_int != announced.fingerprint_int:
            raise SpecError(
                f"the given spec {given.fingerprint} does not match the spec "
                f"{announced.fingerprint} announced on {self._spec_topic}"
            )
        given_seconds = self._given_round_seconds
        if given_seconds is not None and given_seconds != announcement["round_seconds"]:
            raise SpecError(
                f"the given round_seconds {given_seconds} does not match the "
                f"round_seconds {announcement['round_seconds']} announced on {self._spec_topic}"
            )
        return announced

    def _check_announcement(self, spec: MechanismSpec) -> None:
        """Refuse to spend budget on reports the shuffler would reject as a stale spec."""
        with self._cond:
            announcement = self._announcement
        if announcement is not None and announcement["spec"]["fingerprint"] != spec.fingerprint:
            raise SpecError(
                f"the deployment now announces spec {announcement['spec']['fingerprint']}, "
                f"this publisher runs {spec.fingerprint}; restart the device to adopt it"
            )

    # -- paho callbacks (network thread) ----------------------------------------------------

    def _on_connect(
        self,
        client: mqtt.Client,
        _userdata: Any,
        _flags: mqtt.ConnectFlags,
        reason_code: ReasonCode,
        _properties: Properties | None,
    ) -> None:
        if reason_code.is_failure:
            refused = is_version_refusal(reason_code)
            if not (refused and self._version.requested == "auto"):
                logger.warning(
                    "broker %s refused the connection: %s", self.config.broker, reason_code
                )
            with self._cond:
                self._connect_error = f"broker refused: {reason_code}"
                self._version_refused = self._version_refused or refused
                self._cond.notify_all()
            if refused:
                client.disconnect()  # stop paho reconnecting with a version it refuses
            return
        logger.info("connected to %s", self.config.broker)
        # QoS 0: the retained announcement comes with every subscription anyway, and a QoS 1
        # subscription costs a replicated consumer per device on a NATS cluster.
        result, mid = client.subscribe(self._spec_topic, qos=0)
        with self._cond:
            self._connected = True
            self._connect_error = None
            if result == MQTTErrorCode.MQTT_ERR_SUCCESS:
                self._spec_sub_mid = mid
            self._cond.notify_all()

    def _on_disconnect(
        self,
        _client: mqtt.Client,
        _userdata: Any,
        _flags: mqtt.DisconnectFlags,
        reason_code: ReasonCode,
        _properties: Properties | None,
    ) -> None:
        with self._cond:
            was_connected = self._connected
            self._connected = False
            self._subscribed = False
            if reason_code.is_failure:
                self._connect_error = f"disconnected: {reason_code}"
            self._cond.notify_all()
        if was_connected and self._client is not None:
            logger.warning(
                "disconnected from %s (%s); reconnecting", self.config.broker, reason_code
            )

    def _on_subscribe(
        self,
        _client: mqtt.Client,
        _userdata: Any,
        mid: int,
        reason_codes: list[ReasonCode],
        _properties: Properties | None,
    ) -> None:
        with self._cond:
            if mid == self._spec_sub_mid:
                if any(rc.is_failure for rc in reason_codes):
                    self._announcement_error = f"subscription refused: {reason_codes}"
                self._subscribed = True
                self._cond.notify_all()

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        if message.topic != self._spec_topic or not message.payload:
            return  # an empty retained message only clears the announcement
        try:
            announcement = decode_announcement(bytes(message.payload))
        except SpecError as exc:
            logger.warning("ignoring an invalid spec announcement: %s", exc)
            with self._cond:
                self._announcement_error = str(exc)
                self._cond.notify_all()
            return
        with self._cond:
            previous = self._announcement
            self._announcement = announcement
            self._announcements_seen += 1
            self._cond.notify_all()
        if previous is not None and previous["round_seconds"] != announcement["round_seconds"]:
            logger.warning(
                "the deployment announced round_seconds %d (was %d)",
                announcement["round_seconds"],
                previous["round_seconds"],
            )
        if (
            previous is not None
            and previous["spec"]["fingerprint"] != (announcement["spec"]["fingerprint"])
        ):
            logger.warning(
                "the deployment announced a new spec %s (was %s)",
                announcement["spec"]["fingerprint"],
                previous["spec"]["fingerprint"],
            )

    def _on_publish(
        self,
        _client: mqtt.Client,
        _userdata: Any,
        mid: int,
        reason_code: ReasonCode,
        _properties: Properties | None,
    ) -> None:
        # paho may call this before publish() has returned the mid to the waiting thread, so
        # acknowledgements are recorded, never matched against a pending set.
        with self._cond:
            if mid in self._abandoned:
                self._abandoned.discard(mid)
                return
            self._acks[mid] = reason_code
            self._cond.notify_all()
