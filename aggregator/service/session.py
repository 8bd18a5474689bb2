"""The aggregator's MQTT session: connecting (MQTT 5 or 3.1.1), the lease, the topics.

Delivery is MQTT QoS 1 over a **persistent session** with **manual acknowledgement**: MQTT 5
with ``clean_start=False`` and a session expiry interval, or MQTT 3.1.1 with
``clean_session=False`` (the broker keeps it until a clean connection with the same id).
``mqtt_version="auto"`` connects with MQTT 5 and, once the broker refuses that version
(CONNACK reason 0x84, or return code 1 in the 3.1.1 form), with 3.1.1 for the rest of the
process (:class:`~edge.mqtt_version.VersionChoice`). The PUBACKs are the service's
to send (:class:`~aggregator.service.core.acks.AckGenerations`); :class:`BatchSession` only hands
each message over, with what is needed to acknowledge it later.

One writer per deployment
-------------------------
The MQTT client id is the account's (``username``, else ``coco-aggregator-<deployment>``),
so a second service of the account takes over the one persistent session; the first one
then stops with :class:`SessionTakenOverError` instead of reconnecting and fighting for
it. It knows from a DISCONNECT with MQTT 5 reason ``0x8E`` (*Session taken over*) where
the broker sends one, and from a **lease** where it does not (Mosquitto 2.0 only closes
the socket; no MQTT 3.1.1 broker can send a reason): each run claims the retained topic
``coco/v1/<deployment>/aggregator/lease`` with a random instance token on its first
connection and applies no batch before its own claim comes back; on a reconnection it
applies nothing before the retained claim shows its token again. Another instance's claim
means the session was taken over. The lease works the same on both protocol versions. A
broker that refuses the lease topic (an ACL without it) leaves only the ``0x8E`` signal,
with a warning; one that grants the subscription but drops the claim delays batches by
``lease_timeout``, then they are applied without the lease, with a warning.

The session subscribes to the batches (``batches`` and, for sharded deployments,
``batches/+``), the release manifests (``manifests``, ``manifests/+``) and the retained
spec announcement, so that a changed announcement is seen while the service runs
(:mod:`aggregator.service.trust`); :func:`route` tells a batch from a manifest and names
the shard. The session does not subscribe to the announcement again while connected (the
fleet and the shufflers do, on connections of their own): once, a SUBSCRIBE on this
persistent session came 2 s before two QoS 1 batches that NATS 2.9 never delivered to it.
The cause is not known (the same loss was seen once before such SUBSCRIBEs existed), and
the persistent session is left alone; a lost live announcement arrives at the next
connection. (The tests and compose now run NATS 2.15.1, which did not show that loss:
docs/brokers.md.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import secrets
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from aggregator.service.config import AggregatorConfig
from edge import mqtt_url, topics
from edge.errors import CocoError
from edge.mqtt_version import Negotiated, VersionChoice, is_version_refusal

logger = logging.getLogger("aggregator.service")

LEASE_WAIT = 2.0
"""Seconds a reconnected service waits for the retained lease before claiming it anew."""
SESSION_TAKEN_OVER = 0x8E
"""MQTT 5 reason code of a DISCONNECT sent because another client connected with our id."""

Ack = tuple[paho.Client, int, int]
"""What a PUBACK needs: the connection's paho client, the message id and its QoS."""


class SessionTakenOverError(CocoError):
    """The broker handed this service's MQTT session to another client with the same id."""


def mqtt_connection(
    broker: str,
    *,
    username: str | None = None,
    password: str | None = None,
    ca_file: str | None = None,
    node: mqtt_url.BrokerAddress | None = None,
) -> dict[str, Any]:
    """Keyword arguments of :class:`aiomqtt.Client` for ``broker`` (``mqtt://`` or
    ``mqtts://``, or a cluster's comma-separated nodes: :func:`edge.mqtt_url.parse_broker_urls`;
    ``node`` picks one, default the first): address, credentials, and for ``mqtts://`` a
    verifying TLS context (``ca_file``, or the system's CA store)."""
    address = node if node is not None else mqtt_url.parse_broker_urls(broker)[0]
    kwargs: dict[str, Any] = {
        "hostname": address.host,
        "port": address.port,
        "username": username,
        "password": password,
    }
    if address.tls:
        kwargs["tls_context"] = ssl.create_default_context(cafile=ca_file)
    return kwargs


def lease_topic(deployment: str) -> str:
    """``coco/v1/<deployment>/aggregator/lease``: the retained claim of the aggregator that
    holds the deployment's session (module docs, *One writer per deployment*)."""
    return topics.lease_topic(deployment)


def route(deployment: str, topic: str) -> tuple[str, str | None]:
    """``("batch" | "manifest", shard label or None)`` of a message's topic; a label that is
    not one is passed on as it is (the core refuses it: ``unknown_shard``)."""
    rest = topic.removeprefix(f"{topics.PROTOCOL}/{deployment}/")
    kind, _, shard = rest.partition("/")
    return ("manifest" if kind == "manifests" else "batch"), (shard or None)


def session_taken_over(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is the broker's DISCONNECT 0x8E."""
    return _reason_in_chain(exc, lambda rc: rc == SESSION_TAKEN_OVER)


def version_refused(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a CONNACK refusing the protocol version."""
    return _reason_in_chain(exc, is_version_refusal, connect_only=True)


def _reason_in_chain(
    exc: BaseException, match: Callable[[object], bool], *, connect_only: bool = False
) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        rc = getattr(current, "rc", None)
        kind_ok = not connect_only or isinstance(current, MqttConnectError)
        if rc is not None and kind_ok and match(getattr(rc, "value", rc)):
            return True
        current = current.__cause__ or current.__context__
    return False


def make_client(
    connection: dict[str, Any],
    version: Negotiated,
    *,
    client_id: str | None = None,
    session_expiry: int = 0,
    timeout: float = 10,
) -> aiomqtt.Client:
    """An :class:`aiomqtt.Client` of ``version``; with ``client_id``, a persistent session
    (3.1.1 ``clean_session=False``; MQTT 5 ``clean_start=False`` and ``session_expiry``)."""
    if version == "3.1.1":
        return aiomqtt.Client(
            **connection,
            identifier=client_id,
            protocol=aiomqtt.ProtocolVersion.V311,
            clean_session=False if client_id is not None else None,
            keepalive=30,
            timeout=timeout,
        )
    properties = None
    if client_id is not None:
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = session_expiry
    return aiomqtt.Client(
        **connection,
        identifier=client_id,
        protocol=aiomqtt.ProtocolVersion.V5,
        clean_start=False if client_id is not None else paho.MQTT_CLEAN_START_FIRST_ONLY,
        properties=properties,
        keepalive=30,
        timeout=timeout,
    )


OnBatch = Callable[[paho.Client, aiomqtt.Message], Awaitable[None]]


class BatchSession:
    """Connect, claim the lease, subscribe and hand every batch to ``on_batch``, until
    cancelled; reconnect with exponential backoff (module docs).

    ``on_batch(paho_client, message)`` applies a batch and keeps what it needs for its
    PUBACK; ``on_end(paho_client)`` is called when that connection is gone (its PUBACKs can
    no longer be sent); ``on_stop(paho_client, unread)`` is awaited on cancellation while
    still connected (a final checkpoint sends its PUBACKs); ``on_announcement(payload)``
    gets each spec announcement. Raises :class:`SessionTakenOverError` when another client
    takes the session over (``taken_over`` is then set).
    """

    def __init__(
        self,
        config: AggregatorConfig,
        *,
        on_batch: OnBatch,
        on_end: Callable[[paho.Client], None],
        on_stop: Callable[[paho.Client, int], Awaitable[None]],
        on_announcement: Callable[[bytes], None],
    ) -> None:
        self.config = config
        self.on_batch = on_batch
        self.on_end = on_end
        self.on_stop = on_stop
        self.on_announcement = on_announcement
        self.version = VersionChoice(config.mqtt_version, broker=config.broker)
        self.nodes = mqtt_url.BrokerList(config.broker)
        """The broker's nodes: a lost or refused connection moves to the next one."""
        self.subscribed = asyncio.Event()
        """Set while subscribed to the batches topic."""
        self.connections = 0
        self.confirmed = False
        """Whether this connection holds the session (its lease came back, or no lease is
        in use): only then is a checkpoint worth writing, since only then can its PUBACKs
        go out. Not writing one while the session may be another's keeps the batches the
        broker redelivers to that other service out of this one's files."""
        self.taken_over = False
        self.instance = secrets.token_hex(8)
        """This run's claim on the lease topic."""
        self._lease_fallback: asyncio.Task[None] | None = None
        self._lease_refused_logged = False
        self._on_subscribed: Callable[[bool], None] = lambda _: None

    def watch_subscribed(self, callback: Callable[[bool], None]) -> None:
        self._on_subscribed = callback

    def _set_subscribed(self, subscribed: bool) -> None:
        if subscribed:
            self.subscribed.set()
        else:
            self.subscribed.clear()
        self._on_subscribed(subscribed)

    def _client(self) -> aiomqtt.Client:
        cfg = self.config
        connection = mqtt_connection(
            cfg.broker,
            username=cfg.username,
            password=cfg.password,
            ca_file=cfg.ca_file,
            node=self.nodes.current,
        )
        client = make_client(
            connection,
            self.version.current,
            client_id=cfg.mqtt_client_id,
            session_expiry=cfg.session_expiry,
        )
        # aiomqtt 2.x does not expose paho's manual acknowledgement; the PUBACK must wait for
        # the checkpoints (aggregator.service.core.acks.AckGenerations): switch it on in paho.
        client._client.manual_ack_set(True)
        return client

    def _taken_over(self, how: str) -> SessionTakenOverError:
        # Batches applied since the last checkpoint are not acknowledged: the broker
        # redelivers them to the session's new holder, so they must not be in our
        # checkpoint either (the two checkpoints stay disjoint).
        self.taken_over = True
        return SessionTakenOverError(
            f"another client took over this aggregator's MQTT session "
            f"({self.config.mqtt_client_id}; {how}): another aggregator of deployment "
            f"{self.config.deployment} is running; stopping instead of fighting for it"
        )

    async def _claim_lease(self, client: aiomqtt.Client, *, first: bool) -> bool:
        """Subscribe to the lease topic and, on the first connection of this run, claim it.
        Returns whether the lease is in use (``False`` where the broker refuses the topic)."""
        lease = lease_topic(self.config.deployment)
        granted = await client.subscribe(lease, qos=1)
        codes = granted if isinstance(granted, list) else []
        if any(getattr(code, "value", code) >= 0x80 for code in codes):
            if not self._lease_refused_logged:
                self._lease_refused_logged = True
                logger.warning(
                    "the broker refuses the lease topic %s; a takeover of this session is "
                    "detected only from a DISCONNECT with reason 0x8E (never on MQTT 3.1.1)",
                    lease,
                )
            return False
        if first:
            await self._publish_lease(client)
        else:
            # Wait for the retained lease (module docs); claim it if there is none.
            self._lease_fallback = asyncio.create_task(
                self._claim_lease_later(client), name="coco-aggregator-lease"
            )
        return True

    async def _publish_lease(self, client: aiomqtt.Client) -> None:
        claim = json.dumps(
            {"instance": self.instance, "client_id": self.config.mqtt_client_id},
            separators=(",", ":"),
        )
        await client.publish(lease_topic(self.config.deployment), claim, qos=1, retain=True)

    async def _claim_lease_later(self, client: aiomqtt.Client) -> None:
        await asyncio.sleep(LEASE_WAIT)
        with contextlib.suppress(aiomqtt.MqttError):
            await self._publish_lease(client)

    def _lease_verdict(self, message: aiomqtt.Message, *, first: bool, own_seen: bool) -> bool:
        """Whether ``message`` (on the lease topic) is our own claim; raises
        :class:`SessionTakenOverError` if it shows another instance holding the lease.

        The broker delivers the claims in the order it receives them, so on the first
        connection of a run anything before our own claim is older than it (a previous
        holder's, or one left in the session) and is ignored, even once ``lease_timeout``
        has let batches through: behind a backlog of unacknowledged batches (the broker's
        in-flight window) the retained claim of the run before a crash arrives late. After
        our own claim, or on a reconnection, another instance's claim means it took over."""
        try:
            payload = message.payload
            text = bytes(payload).decode() if isinstance(payload, bytes | bytearray) else ""
            instance = json.loads(text).get("instance") if text else None
        except (ValueError, AttributeError):
            instance = None
        if instance == self.instance:
            return True
        if first and not own_seen:
            return False
        raise self._taken_over("its lease is held by another instance")

    def _announcement(self, paho_client: paho.Client, message: aiomqtt.Message) -> None:
        if message.qos > 0:
            paho_client.ack(message.mid, message.qos)
        payload = message.payload
        if isinstance(payload, bytes | bytearray):
            self.on_announcement(bytes(payload))

    async def _consume(
        self, client: aiomqtt.Client, held: list[aiomqtt.Message], *, first: bool, confirmed: bool
    ) -> None:
        """Hand over the batches of one connection; none before the lease is confirmed
        (they wait in ``held``, unacknowledged)."""
        deployment = self.config.deployment
        lease, spec = lease_topic(deployment), topics.spec_topic(deployment)
        paho_client = client._client
        messages = client.messages
        deadline = time.monotonic() + self.config.lease_timeout
        own_seen = False  # our claim came back on this connection
        while True:
            self.confirmed = confirmed
            if confirmed:
                message = await anext(messages)
            else:
                try:
                    # Not asyncio.wait_for: cancelled here (a stop right after the start),
                    # it never returned (Python 3.11, aiomqtt 2; tests/aggregator/
                    # test_service.py, a stop before the lease claim came back).
                    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                        message = await anext(messages)
                except TimeoutError:
                    logger.warning(
                        "no claim on %s came back within %g s; applying batches without the "
                        "lease (only a DISCONNECT 0x8E can now show a takeover)",
                        lease,
                        self.config.lease_timeout,
                    )
                    confirmed = True
                    for waiting in held:
                        await self.on_batch(paho_client, waiting)
                    held.clear()
                    continue
            if message.topic.matches(spec):
                self._announcement(paho_client, message)
            elif message.topic.matches(lease):
                if message.qos > 0:
                    paho_client.ack(message.mid, message.qos)
                if self._lease_verdict(message, first=first, own_seen=own_seen):
                    own_seen = confirmed = True
                    for waiting in held:
                        await self.on_batch(paho_client, waiting)
                    held.clear()
            elif confirmed:
                await self.on_batch(paho_client, message)
            else:
                held.append(message)

    async def run(self) -> None:
        delay = self.config.reconnect_min
        deployment = self.config.deployment
        topic = topics.batches_topic(deployment)
        client_id = self.config.mqtt_client_id
        while True:
            client = self._client()
            paho_client = client._client
            held: list[aiomqtt.Message] = []
            try:
                async with client:
                    first = self.connections == 0
                    confirmed = not await self._claim_lease(client, first=first)
                    for subscription in (
                        topic,
                        topics.batches_filter(deployment),
                        topics.manifests_topic(deployment),
                        topics.manifests_filter(deployment),
                        topics.spec_topic(deployment),
                    ):
                        await client.subscribe(subscription, qos=1)
                    self.connections += 1
                    self._set_subscribed(True)
                    logger.info(
                        "subscribed to %s at %s as %s (MQTT %s)",
                        topic,
                        self.config.broker,
                        client_id,
                        self.version.current,
                    )
                    delay = self.config.reconnect_min
                    try:
                        await self._consume(client, held, first=first, confirmed=confirmed)
                    except asyncio.CancelledError:
                        # Shutdown: checkpoint and send the PUBACKs while still connected.
                        await asyncio.shield(
                            self.on_stop(paho_client, len(client.messages) + len(held))
                        )
                        raise
            except aiomqtt.MqttError as exc:
                if session_taken_over(exc):
                    raise self._taken_over("the broker said so, reason 0x8E") from None
                if version_refused(exc):
                    if self.version.refused():
                        continue  # at once, with MQTT 3.1.1
                    raise CocoError(self.version.describe_refusal()) from None
                self.nodes.failed()  # a cluster's next node (the lost one may have died)
                logger.warning("broker connection lost (%s); reconnecting in %.2f s", exc, delay)
            finally:
                self.confirmed = False
                self._set_subscribed(False)
                if self._lease_fallback is not None:
                    self._lease_fallback.cancel()
                    self._lease_fallback = None
                self.on_end(paho_client)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(2 * delay, self.config.reconnect_max)
