"""``coco shuffler prepare``: create a shard's ingest session before its shuffler first runs.

A broker keeps nothing published to a topic that no session has subscribed: in a reshard,
devices publish to a new shard's ingress topics from the new layout's first round, and if
that shard's shuffler has not subscribed by then, the broker acknowledges those reports to
the devices and drops them, and nothing in the pipeline can count them. Preparing a shard
connects once with exactly the session its shuffler will use (the same client id,
:func:`broker.service.config.ingest_client_id`; the same protocol version, negotiated the
same way; a persistent session, MQTT 5 with the shuffler's session expiry,
:data:`broker.service.config.SESSION_EXPIRY`, or 3.1.1 ``clean_session=0``), subscribes
the shard's ingress filter at QoS 1 and disconnects keeping the session. From then on the
broker queues the shard's reports (up to its own queue limit: Mosquitto
``max_queued_messages``) until the shuffler connects and takes the session over.

A shard whose lease is held and fresh (its shuffler runs) is refused
(:class:`ShardRunningError`): connecting with its client id would take the running
shuffler's session over and stop it. The lease is read just before connecting; a shuffler
that starts during the second or so of a preparation can still meet it (it then either
takes the prepared session over, which is what preparing is for, or is taken over and
stops): do not run both at once.

Preparing again is harmless: the session is there (``session present``) and the
subscription is replaced by the same one. Reports the broker had queued and sends to the
preparing connection are never acknowledged by it: they stay in the session, and the
shuffler gets them (Mosquitto re-sends them when it connects; NATS when its ``ack_wait``
expires, 30 s by default). Reports published at QoS 0 are never queued for an absent
session, prepared or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from dataclasses import dataclass

import aiomqtt
import gmqtt  # type: ignore[import-untyped]
from gmqtt.mqtt.constants import MQTTv50, MQTTv311  # type: ignore[import-untyped]

from broker.service.config import INGEST_MAX_PACKET, SESSION_EXPIRY, ingest_client_id
from broker.service.ingest import MQTT_LOGGER, Acks, IngestError
from broker.service.lease import LeaseUnconfirmedError, ShardControl
from edge.errors import CocoError
from edge.mqtt_url import BrokerList
from edge.mqtt_version import MqttVersion, Negotiated, negotiate
from edge.topics import ingress_filter

__all__ = ["PrepareSettings", "Prepared", "ShardRunningError", "prepare_shard"]

_GMQTT_NO_AUTO_RECONNECT = -2  # as the shuffler's ingest (broker/service/ingesting.py)
_GMQTT_KEEPALIVE = 60
_SESSION_TAKEN_OVER = 0x8E


class ShardRunningError(CocoError):
    """The shard's lease is held and fresh: its shuffler runs, and preparing would stop it."""


@dataclass(frozen=True, kw_only=True)
class PrepareSettings:
    """What the shard's shuffler connects with (``coco shuffler``'s options of the same
    names), and how long to wait for the broker."""

    broker: str
    deployment: str
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    client_id: str | None = None
    mqtt_version: MqttVersion = "auto"
    session_expiry: int = SESSION_EXPIRY
    lease_settle: float = 1.0
    """Seconds to wait for the retained lease (as the shuffler's own lease read)."""
    timeout: float = 10.0
    announced: bool = False
    """The deployment's announcement is retained (``coco shuffler prepare`` reads it first):
    a node that delivers neither it nor the lease serves no retained messages yet, and the
    next node is asked whether the shard's shuffler runs (broker/service/lease.py)."""


@dataclass(frozen=True)
class Prepared:
    """One prepared session."""

    shard: str | None
    client_id: str
    filter: str
    version: Negotiated
    session_present: bool
    """The broker held the session already (prepared before, or the shuffler ran)."""
    held: int
    """Queued reports the broker sent to this connection, left unacknowledged (module docs)."""
    expiry: int | None
    """The session expiry asked for (MQTT 5); ``None`` on 3.1.1 (kept until a clean
    connection)."""

    def line(self) -> str:
        """One line for the operator (no device is named: only the shard's filter)."""
        name = "deployment (unsharded)" if self.shard is None else f"shard {self.shard}"
        state = "already present" if self.session_present else "created"
        expiry = "" if self.expiry is None else f", expiry {self.expiry} s"
        held = (
            f"; {self.held} queued reports left unacknowledged for the shuffler"
            if self.held
            else ""
        )
        return (
            f"prepared {name}: session {self.client_id} ({state}, MQTT {self.version}"
            f"{expiry}) subscribed to {self.filter} at QoS 1{held}"
        )


async def prepare_shard(settings: PrepareSettings, shard: str | None) -> Prepared:
    """Prepare ``shard``'s session (``None``: an unsharded deployment's one session).

    Raises :class:`ShardRunningError` if its shuffler runs, :class:`CocoError` if no node
    of ``settings.broker`` could be used."""
    nodes = BrokerList(settings.broker)
    tls = ssl.create_default_context(cafile=settings.ca_file) if nodes.tls else None
    for attempt in range(1, len(nodes) + 1):
        try:
            version = await negotiate(
                settings.mqtt_version,
                nodes.current.host,
                nodes.current.port,
                tls=tls,
                timeout=settings.timeout,
            )
            await _refuse_if_running(settings, shard, nodes, version)
            return await _subscribe_session(settings, shard, nodes, version, tls)
        except (
            OSError,
            TimeoutError,
            aiomqtt.MqttError,
            gmqtt.MQTTConnectError,
            LeaseUnconfirmedError,
        ) as exc:
            if attempt == len(nodes):
                raise CocoError(f"cannot prepare at {settings.broker}: {exc}") from exc
            nodes.failed()  # a cluster's next node
    raise AssertionError("unreachable")  # pragma: no cover


async def _refuse_if_running(
    settings: PrepareSettings, shard: str | None, nodes: BrokerList, version: Negotiated
) -> None:
    control = ShardControl(
        nodes=nodes,
        tls=nodes.tls,
        ca_file=settings.ca_file,
        username=settings.username,
        password=settings.password,
        client_id=_client_id(settings, shard),
        deployment=settings.deployment,
        shard=shard,
        owner="coco-shuffler-prepare",
        settle=settings.lease_settle,
        mqtt5=version == "5",
        timeout=settings.timeout,
        announced=settings.announced,
    )
    lease = await control.read()
    now = time.time()
    if lease is not None and lease.fresh(now):
        raise ShardRunningError(
            f"{control.name} is held by a running shuffler (state directory id "
            f"{lease.owner}, lease renewed {now - lease.renewed:.0f} s ago, ttl "
            f"{lease.ttl:g} s): not prepared, its session is already in use (connecting "
            "with its client id would take the session over and stop that shuffler)"
        )


def _client_id(settings: PrepareSettings, shard: str | None) -> str:
    return ingest_client_id(
        settings.deployment, shard, client_id=settings.client_id, username=settings.username
    )


async def _subscribe_session(
    settings: PrepareSettings,
    shard: str | None,
    nodes: BrokerList,
    version: Negotiated,
    tls: ssl.SSLContext | None,
) -> Prepared:
    """Connect with the shuffler's session, subscribe its filter, disconnect keeping it."""
    client_id = _client_id(settings, shard)
    topic_filter = ingress_filter(settings.deployment, shard)
    kwargs: dict[str, object] = {}
    if version == "5":
        kwargs["session_expiry_interval"] = settings.session_expiry
        kwargs["maximum_packet_size"] = INGEST_MAX_PACKET
        kwargs["receive_maximum"] = 1  # this connection holds at most one queued report
    client = gmqtt.Client(client_id, clean_session=False, logger=MQTT_LOGGER, **kwargs)
    client.set_config({"reconnect_retries": _GMQTT_NO_AUTO_RECONNECT})
    if settings.username is not None:
        client.set_auth_credentials(settings.username, settings.password)
    held = 0

    def hold(*_: object) -> None:
        """A queued QoS 1 report: never acknowledged here, so it stays in the session
        (the one incoming-PUBLISH hook, as in broker.service.ingest.ack_after_handling)."""
        nonlocal held
        held += 1

    client._package_handler._handle_qos_1_publish_packet = hold
    client.on_message = lambda *_: 0  # QoS 0 (published so): never queued, nothing to keep
    present = False

    def on_connect(_client: object, flags: object, _rc: object, _props: object) -> None:
        nonlocal present
        present = bool(flags)

    client.on_connect = on_connect
    acks = Acks(settings.timeout)
    client.on_subscribe = acks.on_ack
    client.on_disconnect = acks.on_disconnect
    try:
        async with asyncio.timeout(settings.timeout):
            await client.connect(
                nodes.current.host,
                nodes.current.port,
                ssl=tls or False,
                keepalive=_GMQTT_KEEPALIVE,
                version=MQTTv311 if version == "3.1.1" else MQTTv50,
            )
        if acks.lost.is_set():
            raise OSError("connection lost")
        try:
            codes = await acks.wait(
                client.subscribe(topic_filter, qos=1, retain_as_published=version == "5")
            )
        except IngestError as exc:
            raise OSError(str(exc)) from exc
        if not codes or codes[0] >= 0x80:
            raise CocoError(
                f"the broker refused the subscription of {client_id} to {topic_filter} "
                f"({codes!r}): not prepared"
            )
        if acks.lost.is_set():
            if acks.reason == _SESSION_TAKEN_OVER:
                raise CocoError(
                    f"another client connected as {client_id} while it was being prepared "
                    "(its shuffler starting?): check that shuffler"
                )
            raise OSError("connection lost")
    finally:
        if not acks.lost.is_set():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(settings.timeout):
                    await client.disconnect()  # reason 0: the broker keeps the session
    expiry = settings.session_expiry if version == "5" else None
    return Prepared(shard, client_id, topic_filter, version, present, held, expiry)
