"""Read a deployment's retained spec announcement, from whichever node of ``--broker`` answers.

Every service reads the announcement when it starts (the fleet, each shuffler, the
aggregator), often right after a crash and while a node of the broker cluster is itself down
or just restarted. So one reading walks the nodes of ``--broker`` until ``timeout``:

* a node that cannot be reached (refused, reset, timed out) gives way to the next one;
* a node that accepts the connection but does not deliver the retained announcement within
  its share of the time (:data:`NODE_WAIT` seconds at least) gives way too: a NATS node that
  has just restarted accepts MQTT connections before it serves the retained messages, and
  the one reading would otherwise spend all its time there (a restarted aggregator exited
  so, with two healthy nodes beside it);
* after a full round of the nodes with nothing, a short pause (doubling, at most
  :data:`MAX_PAUSE` seconds), then round again;
* a refusal that connecting again cannot change ends the reading at once: a wrong password
  or a missing permission (CONNACK *not authorized*), MQTT 5 refused where 3.1.1 was not
  allowed (``--mqtt-version 5``), or a TLS error (:func:`final_refusal`).

``mqtt_version`` ``auto`` connects with MQTT 5 and, once a broker refuses that version, with
3.1.1 (:class:`edge.mqtt_version.VersionChoice`). Errors:
:class:`NotAnnouncedError` (a :class:`edge.errors.SpecError`) when brokers answered and none
delivered an announcement in time (``coco announce`` was not run, or its message was
deleted); :class:`edge.errors.CocoError` when none could be read
from (the last cause in the message); ``SpecError`` too for an announcement that is not a
valid one (:func:`edge.announce.decode_announcement`).

The fleet, which keeps watching the announcement for layouts while it runs, subscribes to it
again every :data:`REFRESH_SECONDS` (:func:`refreshing`): a SUBSCRIBE that replaces a
subscription makes the broker send the retained message again (MQTT 3.1.1 section 3.8.4,
MQTT 5 Retain Handling 0), so an announcement whose live delivery was lost arrives within
one refresh, not only at the next reconnection. Seen on a 3-node NATS cluster: two of three
shufflers never heard of a reshard announced while they ran (they now refresh at each lease
renewal).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiomqtt
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.reasoncodes import ReasonCode

from edge import mqtt_url, topics
from edge.announce import decode_announcement
from edge.errors import CocoError, SpecError
from edge.mqtt_version import MqttVersion, VersionChoice, is_version_refusal

__all__ = [
    "MAX_PAUSE",
    "NODE_WAIT",
    "REFRESH_SECONDS",
    "NotAnnouncedError",
    "fetch_announcement",
    "final_refusal",
    "refreshing",
]

logger = logging.getLogger(__name__)

NODE_WAIT = 2.0
"""Seconds a node that answered gets, at least, to deliver the retained announcement before
the next node is asked (each node gets ``timeout / (2 * nodes)`` when that is longer)."""
MAX_PAUSE = 2.0
"""The longest pause between two rounds of the nodes."""


class NotAnnouncedError(SpecError):
    """Brokers answered, and none delivered a retained announcement in time."""


REFRESH_SECONDS = 30.0
"""How often a running service subscribes to the announcement again (module docs)."""
_NOT_AUTHORIZED = frozenset({4, 5, 0x86, 0x87})
"""CONNACK codes that another try cannot change: bad user name or password, not authorized
(MQTT 3.1.1's 4 and 5, MQTT 5's 0x86 and 0x87)."""


def final_refusal(exc: BaseException) -> bool:
    """Whether connecting again cannot help: a CONNACK *not authorized* or *bad user name or
    password*, a refused protocol version (the caller's :class:`VersionChoice` decides
    whether another version is worth a try), or a TLS error (a certificate that does not
    verify stays so)."""
    code = _connack_code(exc)
    if code is not None and (code in _NOT_AUTHORIZED or is_version_refusal(code)):
        return True
    return isinstance(exc, ssl.SSLError)


def _connack_code(exc: BaseException) -> int | None:
    """The CONNACK code of a refused connection in ``exc``'s chain (aiomqtt raises it as the
    cause of what it raises, or itself), ``None`` if the connection was not refused so."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MqttConnectError) and current.rc is not None:
            rc = current.rc
            return rc.value if isinstance(rc, ReasonCode) else rc
        current = current.__cause__ or current.__context__
    return None


async def fetch_announcement(
    broker: str,
    deployment: str,
    *,
    timeout: float = 10.0,
    username: str | None = None,
    password: str | None = None,
    ca_file: str | None = None,
    client_id: str | None = None,
    mqtt_version: MqttVersion = "auto",
) -> dict[str, Any]:
    """The retained spec announcement of ``deployment``, decoded and checked (module docs).

    ``client_id``: for an account bound to its client id (a device's, under Mosquitto's
    dynamic-security plugin); default: one the broker assigns (MQTT 5) or a random one."""
    nodes = mqtt_url.BrokerList(broker)
    choice = VersionChoice(mqtt_version, broker=broker)
    topic = topics.spec_topic(deployment)
    tls = ssl.create_default_context(cafile=ca_file) if nodes.tls else None
    share = max(NODE_WAIT, timeout / (2 * len(nodes))) if len(nodes) > 1 else timeout
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    connected = asyncio.Event()  # some node accepted a connection
    last: BaseException | None = None
    pause = 0.1
    tried = 0
    while (remaining := deadline - loop.time()) > 0:
        node = nodes.current
        client = aiomqtt.Client(
            node.host,
            node.port,
            username=username,
            password=password,
            identifier=client_id,
            tls_context=tls,
            protocol=aiomqtt.ProtocolVersion.V5 if choice.mqtt5 else aiomqtt.ProtocolVersion.V311,
            timeout=min(remaining, share),
        )
        try:
            return await _read_node(client, topic, min(remaining, share), connected.set)
        except (OSError, aiomqtt.MqttError) as exc:  # TimeoutError included: its share spent
            code = _connack_code(exc)
            if code is not None and is_version_refusal(code):
                if choice.refused():
                    continue
                raise CocoError(choice.describe_refusal()) from None
            if final_refusal(exc):  # not authorized, or a TLS error
                raise CocoError(f"cannot read the spec announcement from {broker}: {exc}") from exc
            last = exc
        if len(nodes) > 1:
            logger.info(
                "no spec announcement from %s:%d yet; asking the next node", node.host, node.port
            )
        nodes.failed()
        tried += 1
        if tried % len(nodes) == 0:  # a whole round of the nodes: pause before the next
            with contextlib.suppress(TimeoutError):
                await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
            pause = min(pause * 2, MAX_PAUSE)
    if connected.is_set():
        raise NotAnnouncedError(
            f"no announcement on {topic} within {timeout:g} s (run coco announce, or pass --spec)"
        )
    raise CocoError(f"cannot read the spec announcement from {broker}: {last}")


async def _read_node(
    client: aiomqtt.Client, topic: str, wait: float, on_connected: Callable[[], None]
) -> dict[str, Any]:
    """The announcement from ``client``'s node within ``wait`` seconds (``TimeoutError``:
    none; an ``OSError`` or ``MqttError``: the node failed)."""
    found: dict[str, Any] | None = None
    try:
        async with asyncio.timeout(wait):
            async with client:
                on_connected()
                # QoS 0: the retained announcement comes with the subscription either way
                # (and a QoS 1 subscription can be refused while a node of a NATS cluster is
                # down)
                await client.subscribe(topic, qos=0)
                async for message in client.messages:
                    payload = message.payload
                    if not isinstance(payload, bytes | bytearray):
                        raise SpecError("the spec announcement is not a binary payload")
                    found = decode_announcement(bytes(payload))
                    break
    except (OSError, aiomqtt.MqttError):
        if found is None:
            raise
        # read: only the DISCONNECT after it failed or was late
    if found is None:
        raise SpecError("the broker closed the announcement subscription")  # pragma: no cover
    return found


@contextlib.asynccontextmanager
async def refreshing(
    client: aiomqtt.Client, topic: str, *, qos: int, every: float = REFRESH_SECONDS
) -> AsyncIterator[None]:
    """While the block runs, subscribe ``client`` to ``topic`` again every ``every`` seconds
    (module docs). A lost connection ends the refreshing quietly: the block's own reading of
    the messages sees the loss."""

    async def refresh() -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await client.subscribe(topic, qos=qos)
            except aiomqtt.MqttError as exc:  # a late SUBACK, or the connection is gone
                # (the block's own reading of the messages sees a lost connection)
                logger.debug("refreshing %s: %s", topic, exc)

    task = asyncio.create_task(refresh(), name=f"refresh {topic}")
    try:
        yield
    finally:
        task.cancel()
        # not `await task`: a cancellation of this task arriving meanwhile must propagate
        await asyncio.wait([task])
