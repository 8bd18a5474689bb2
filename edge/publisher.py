"""A device's MQTT publisher: sensor vector -> ledger charge -> eps-LDP report -> broker.

One :class:`DevicePublisher` per device. It connects to the broker (paho-mqtt; MQTT 5, or
3.1.1 where the broker refuses 5 or on request: :mod:`edge.mqtt_version`), learns the
mechanism from the deployment's retained spec announcement (or is given it, and then checks
that it matches the announcement), and for every vector:

1. encodes the readings with :class:`~edge.encoders.SensorEncoder` (or takes keys and signs
   that are already sparse),
2. charges the device's :class:`~edge.ledger.BudgetLedger` ``spec.epsilon`` *before* anything
   leaves the device (a crash after the charge wastes budget, never under-counts it),
3. randomises on the device path (:meth:`LocalMechanism.randomise_keys` with the ``secrets``
   CSPRNG: the report's privacy rests on randomness the network cannot predict),
4. encodes the 16-byte report (:func:`edge.codec.encode_report`) for the current round and
   publishes it to its own ingress topic ``coco/v1/<deployment>/ingress/<device-id>`` (in
   a sharded deployment ``.../ingress/<shard label>/<device-id>``, the shard of the
   report's round: :mod:`edge.shards`), waiting for the PUBACK.

Rounds come from the clock (:mod:`edge.rounds`): a report's round is
``floor(unix_time / round_seconds)`` at the moment it is sent, with ``round_seconds`` from the
latest announcement (or, when no announcement is retained, the ``round_seconds`` the caller
gives). A publisher sends at most one report per round: a second publish in the same round
waits for the next one. A clock that is not set (before 2025-01-01) raises
:class:`~edge.rounds.ClockError` before anything is charged or sent. A *restarted* device does
not know whether it already reported in the current round, and may report again: the
shuffler keeps the first and rejects the second as a duplicate (docs/protocol.md, "Rounds").

Why QoS 1: a report that is lost after its budget was charged spends privacy for nothing,
so the device wants delivery confirmed (and a clear failure when it is not). QoS 1 may
deliver a report twice (paho resends the same bytes, with the same round, after a
reconnect); the shuffler keeps one report per device per round, so a duplicate costs
nothing. (QoS 2 works too but buys nothing for that extra round trip; QoS 0 is
accepted for experiments and then "delivered" only means "written to the socket".)

The MQTT client id is the device id (the broker binds client ids to accounts: the device's
user name is its id too). The device id is in the topic and the client id only, never in the
payload (the shuffler strips topics before anything reaches the aggregator), and it is logged
at DEBUG level only.

Failures: ledger exhaustion is an expected, terminal state of a device, so the publish
methods *return* ``False`` (and publish nothing). Everything else raises a subclass of
:class:`~edge.errors.CocoError`: :class:`PublisherError` for the broker (not connected
within the timeout, no PUBACK within the timeout, PUBACK with an error reason),
:class:`~edge.errors.SpecError` for a spec that does not match the announcement,
:class:`~edge.errors.InputError` for readings outside the encoder's domain, and
:class:`~edge.ledger.LedgerError` for an unwritable ledger.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edge import device
from edge._mechanism import LocalMechanism
from edge.announce import decode_announcement
from edge.codec import encode_report
from edge.encoders import SensorEncoder
from edge.errors import CocoError, InputError, SpecError
from edge.ledger import BudgetExhausted, BudgetLedger
from edge.mqtt_url import parse_broker_url
from edge.mqtt_version import MQTT_VERSIONS, MqttVersion, VersionChoice, is_version_refusal
from edge.rounds import check_round_seconds, current_round, seconds_to_next_round
from edge.shards import ShardPlan
from edge.spec import MechanismSpec
from edge.topics import check_name, ingress_topic, spec_topic

logger = logging.getLogger(__name__)

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


class DevicePublisher:
    """Publishes one eps-LDP report per vector per round for one device (see module doc).

    Use as a context manager (or call :meth:`start` and :meth:`close`); the publish methods
    are thread-safe but serialised. ``lo``, ``hi`` and ``clip`` configure the
    :class:`SensorEncoder` of :meth:`publish_vector`; its ``s`` is the spec's and its
    dimension must be the spec's ``d``.

    ``round_seconds`` is the round length to use when no announcement is retained (it must
    equal the announced one when there is); ``clock`` returns Unix seconds (default
    :func:`time.time`; tests give a fixed or offset clock).
    """

    def __init__(
        self,
        config: PublisherConfig,
        *,
        ledger: BudgetLedger,
        spec: MechanismSpec | None = None,
        lo: Sequence[float] | None = None,
        hi: Sequence[float] | None = None,
        clip: bool = False,
        round_seconds: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if (lo is None) != (hi is None):
            raise ValueError("give both lo and hi, or neither")
        if round_seconds is not None:
            check_round_seconds(round_seconds)
        self.config = config
        self.ledger = ledger
        self._given_spec = spec
        self._lo = None if lo is None else tuple(lo)
        self._hi = None if hi is None else tuple(hi)
        self._clip = clip
        self._given_round_seconds = round_seconds
        self._clock = clock
        self._last_round: int | None = None
        self._topic = ingress_topic(config.deployment, config.device_id)
        """The unsharded ingress topic (a sharded deployment's depends on the round)."""
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

        self._publish_lock = threading.Lock()
        self._client: mqtt.Client | None = None
        self._spec: MechanismSpec | None = None
        self._mechanism: LocalMechanism | None = None
        self._encoder: SensorEncoder | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

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
    def last_round(self) -> int | None:
        """The round of the last report this publisher sent (``None`` before the first)."""
        return self._last_round

    @property
    def connected(self) -> bool:
        with self._cond:
            return self._connected

    def start(self) -> MechanismSpec:
        """Connect, resolve the spec, and return it. Raises on timeout or mismatch."""
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
        assert self._spec is not None
        self._mechanism = LocalMechanism.from_spec(self._spec)
        if self._lo is not None and self._hi is not None:
            if len(self._lo) != self._spec.d:
                self.close()
                raise InputError(
                    f"{len(self._lo)} channel ranges given but the spec has d={self._spec.d}"
                )
            self._encoder = SensorEncoder(lo=self._lo, hi=self._hi, s=self._spec.s, clip=self._clip)
        logger.info(
            "device publisher ready: deployment %s, spec %s (%s, d=%d, s=%d, eps=%g), "
            "budget left %g",
            self.config.deployment,
            self._spec.fingerprint,
            self._spec.mechanism,
            self._spec.d,
            self._spec.s,
            self._spec.epsilon,
            self.ledger.remaining,
        )
        return self._spec

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
        client.enable_logger(logging.getLogger(f"{__name__}.paho"))
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

    # -- publishing ------------------------------------------------------------------------

    def publish_vector(self, values: Sequence[float]) -> bool:
        """Encode sensor readings, then as :meth:`publish_keys`.

        Returns ``False`` (publishing nothing) when the ledger refuses the charge.
        """
        if self._encoder is None:
            raise PublisherError("publish_vector needs channel ranges (lo and hi)")
        keys, signs = self._encoder.encode(values)
        return self.publish_keys(keys, signs)

    def publish_keys(self, keys: Sequence[int], signs: Sequence[int]) -> bool:
        """Publish the report of one sparse ternary vector in the current round; wait for
        the ack.

        The round is the clock's (:func:`edge.rounds.current_round`); if this publisher
        already sent a report in it, this waits for the next round first. Returns ``True``
        once the broker acknowledged the report and ``False`` (publishing nothing) when the
        ledger has no budget left for it; raises otherwise (module doc), in particular
        :class:`~edge.rounds.ClockError` when the clock is not set.
        """
        spec = self.spec
        mechanism = self._mechanism
        client = self._client
        if mechanism is None or client is None:
            raise PublisherError("the publisher is not started")
        try:
            device.check_sparse(list(keys), list(signs), spec.d, spec.s)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        with self._publish_lock:
            self._check_announcement(spec)
            self._round_now()  # an unset clock fails before anything else
            if not self.ledger.can_afford(spec.epsilon):  # no wait for a round it cannot use
                logger.info("report not published: the ledger has no budget left for it")
                return False
            self._next_round()  # wait (if need be) before the publish timeout starts
            deadline = time.monotonic() + self.config.publish_timeout
            self._wait_connected(self.config.publish_timeout)
            round_ = self._next_round()  # the round now, after any wait for the connection
            topic = self._topic_for(round_)  # before the charge: no budget for an unservable round
            try:
                self.ledger.charge(spec.epsilon)
            except BudgetExhausted as exc:
                logger.info("report for round %d not published: %s", round_, exc)
                return False
            seed, z = mechanism.randomise_keys(keys, signs)  # secrets.randbits
            payload = encode_report(spec.fingerprint_int, round_, seed, z)
            self._last_round = round_
            self._send(client, topic, payload, round_, deadline)
        logger.debug("published round %d to %s", round_, topic)
        return True

    # -- internals -------------------------------------------------------------------------

    def _round_now(self) -> int:
        """The clock's round now (:class:`~edge.rounds.ClockError` if the clock is unset)."""
        return current_round(self.round_seconds, self._clock())

    def _next_round(self) -> int:
        """The current round, after waiting for a round this publisher has not reported in."""
        round_ = self._round_now()
        last = self._last_round
        while last is not None and round_ <= last:
            wait = seconds_to_next_round(self.round_seconds, self._clock())
            logger.debug("already reported in round %d; waiting %.3f s", last, wait)
            time.sleep(max(wait, 0.001))
            round_ = self._round_now()
        return round_

    def _topic_for(self, round_: int) -> str:
        """The ingress topic of this device's report of ``round_``: its shard's in a sharded
        deployment (:class:`PublisherError` if no layout serves the round)."""
        with self._cond:
            announcement = self._announcement
        layouts = None if announcement is None else announcement.get("shards")
        if layouts is None:
            return self._topic
        label = ShardPlan.from_json(layouts).label_for(self.config.device_id, round_)
        if label is None:
            raise PublisherError(
                f"no shard layout of the announcement serves round {round_}; not reporting"
            )
        return ingress_topic(self.config.deployment, self.config.device_id, label)

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
