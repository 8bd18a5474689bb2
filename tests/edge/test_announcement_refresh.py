"""A running fleet hears the retained announcement again at every refresh.

The fleet learns a reshard from the announcement. A live delivery can be lost (on a 3-node
NATS cluster, two of three shufflers once never heard of a reshard), so its layout watcher
subscribes to it again every 30 s and the broker re-sends the retained message. Shown here
on Mosquitto with :func:`edge.announcement_reader.refreshing`, as the watcher uses it: the
one announcement, published once, is heard again and again. Without the refresh it is heard
once and the test fails."""

from __future__ import annotations

import aiomqtt
import pytest

from edge.announce import encode_announcement
from edge.announcement_reader import refreshing
from edge.spec import MechanismSpec
from edge.topics import spec_topic
from tests.asyncutil import run
from tests.conftest import Broker

pytestmark = pytest.mark.integration

DEPLOYMENT = "refresh"
SPEC = MechanismSpec(mechanism="coco", d=8, s=2, epsilon=1.0)
EVERY = 0.3
"""Seconds between refreshes."""
HEARD = 4
"""Times the one announcement must be heard: once at the subscription, then at refreshes."""


async def announce(broker: Broker) -> bytes:
    payload = encode_announcement(SPEC.to_dict(), min_batch=100, delta=1e-6)
    async with aiomqtt.Client("127.0.0.1", broker.port) as client:
        await client.publish(spec_topic(DEPLOYMENT), payload, qos=1, retain=True)
    return payload


def test_refreshing_hears_the_retained_message_again(mosquitto: Broker) -> None:
    async def scenario() -> list[bytes]:
        payload = await announce(mosquitto)
        heard: list[bytes] = []
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            topic = spec_topic(DEPLOYMENT)
            await client.subscribe(topic, qos=0)
            async with refreshing(client, topic, qos=0, every=EVERY):
                async for message in client.messages:
                    assert message.payload == payload
                    heard.append(payload)
                    if len(heard) == HEARD:
                        break
        return heard

    assert len(run(scenario(), 30)) == HEARD
