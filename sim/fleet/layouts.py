"""``coco fleet`` follows the deployment's shard layouts as devices do: it keeps watching the
retained announcement, so a reshard announced while the fleet runs moves its reports to the
new layout's shards from the new layout's first round on (docs/protocol.md, section 13.4).

The watch is one extra MQTT connection with a client id of its own, subscribed at QoS 0 to
the spec topic, on the broker's nodes in turn. With per-device credentials (an account bound
to each device's client id) there is no identity to watch with: the layouts read at the
start stay in force, and a reshard needs the fleet restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import ssl
from collections.abc import Callable

import aiomqtt

from edge.announce import decode_announcement, shard_plan
from edge.announcement_reader import refreshing
from edge.errors import SpecError
from edge.mqtt_url import BrokerList
from edge.mqtt_version import Negotiated
from edge.shards import ShardPlan
from edge.topics import spec_topic

__all__ = ["watch_layouts"]

logger = logging.getLogger(__name__)

_RETRY_MIN, _RETRY_MAX = 0.5, 10.0


async def watch_layouts(
    *,
    broker: str,
    deployment: str,
    fingerprint: str,
    version: Callable[[], Negotiated],
    username: str | None,
    password: str | None,
    ca_file: str | None,
    on_plan: Callable[[ShardPlan], None],
) -> None:
    """Call ``on_plan`` with the layouts of every valid announcement of ``deployment`` (of
    the spec ``fingerprint``), until cancelled; reconnects to the next node on a loss."""
    nodes = BrokerList(broker)
    tls = ssl.create_default_context(cafile=ca_file) if nodes.tls else None
    identifier = f"coco-fleet-layouts-{secrets.token_hex(4)}"
    delay = _RETRY_MIN
    warned = False
    while True:
        node = nodes.current
        protocol = aiomqtt.ProtocolVersion.V5 if version() == "5" else aiomqtt.ProtocolVersion.V311
        try:
            async with aiomqtt.Client(
                node.host,
                node.port,
                username=username,
                password=password,
                identifier=identifier,
                tls_context=tls,
                protocol=protocol,
                timeout=10,
            ) as client:
                await client.subscribe(spec_topic(deployment), qos=0)
                delay = _RETRY_MIN
                async with refreshing(client, spec_topic(deployment), qos=0):
                    async for message in client.messages:
                        payload = message.payload
                        if not isinstance(payload, bytes | bytearray) or not payload:
                            continue
                        try:
                            announcement = decode_announcement(bytes(payload))
                        except SpecError:
                            continue  # devices ignore an invalid announcement too
                        if announcement["spec"]["fingerprint"] != fingerprint:
                            if not warned:
                                warned = True
                                logger.warning(
                                    "the deployment announces another spec (%s); the fleet "
                                    "keeps its own: restart it to follow",
                                    announcement["spec"]["fingerprint"],
                                )
                            continue
                        plan = shard_plan(announcement)
                        if plan is not None:
                            on_plan(plan)
        except aiomqtt.MqttError as exc:
            nodes.failed()
            logger.debug("layout watch: connection lost (%s)", exc)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.sleep(delay)
        delay = min(2 * delay, _RETRY_MAX)
