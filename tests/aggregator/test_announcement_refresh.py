"""A running service hears the retained announcement again at every refresh.

The aggregator learns a key rotation or a reshard from the announcement, and the fleet a
reshard. A live delivery can be lost (on a 3-node NATS cluster, two of three shufflers once
never heard of a reshard), so both subscribe to it again every ``announcement_refresh``
seconds and the broker re-sends the retained message. Shown here on Mosquitto with
:func:`edge.announcement_reader.refreshing` and with the aggregator's own session
(:class:`aggregator.service.session.BatchSession`): the one announcement, published once,
is heard again and again. Without the refresh it is heard once and both tests fail."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiomqtt
import paho.mqtt.client as paho
import pytest

from aggregator.service.session import BatchSession
from edge.announce import encode_announcement
from edge.announcement_reader import refreshing
from edge.topics import spec_topic
from tests.aggregator.test_service import DELTA, DEPLOYMENT, MIN_BATCH, SPEC, config
from tests.asyncutil import run
from tests.conftest import Broker
from tests.waiting import until

pytestmark = pytest.mark.integration

EVERY = 0.3
"""Seconds between refreshes."""
HEARD = 4
"""Times the one announcement must be heard: once at the subscription, then at refreshes."""


async def announce(broker: Broker) -> bytes:
    payload = encode_announcement(SPEC.to_dict(), min_batch=MIN_BATCH, delta=DELTA)
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


def test_the_aggregator_session_hears_the_announcement_again(
    mosquitto: Broker, tmp_path: Path
) -> None:
    heard: list[bytes] = []

    async def on_batch(_client: paho.Client, _message: aiomqtt.Message) -> None:
        raise AssertionError("no batch was published")

    async def on_stop(_client: paho.Client, _unread: int) -> None:
        return None

    async def scenario() -> None:
        payload = await announce(mosquitto)
        session = BatchSession(
            config(mosquitto, tmp_path, announcement_refresh=EVERY),
            on_batch=on_batch,
            on_end=lambda _client: None,
            on_stop=on_stop,
            on_announcement=heard.append,
        )
        task = asyncio.create_task(session.run())
        try:
            await until(lambda: len(heard) >= HEARD or task.done(), 30)
            if task.done():
                task.result()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert set(heard) == {payload}

    run(scenario(), 60)
    assert len(heard) >= HEARD
