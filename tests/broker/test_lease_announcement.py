"""A shuffler's lease connection hears the retained announcement again at every renewal.

The announcement is how a sharded shuffler learns that a newer layout takes over (and so
when to retire). Its live delivery can be lost: on a 3-node NATS cluster, two of three
shufflers once never heard of a reshard announced while they ran, and never retired. Each
renewal of the lease therefore subscribes to the announcement again, and the broker re-sends
the retained one (MQTT: a SUBSCRIBE that replaces a subscription re-sends the retained
messages). Shown on Mosquitto and on a NATS cluster, the announcement published on another
node than the watcher's, with :class:`broker.service.lease.ShardControl` as the shuffler
runs it. Without the re-subscription the announcement arrives once and the tests fail."""

from __future__ import annotations

import asyncio
from typing import Any

import aiomqtt
import pytest

from broker.service.lease import ShardControl
from edge.announce import encode_announcement
from edge.mqtt_url import BrokerList, parse_broker_urls
from edge.spec import MechanismSpec
from edge.topics import spec_topic
from tests.clusters import NatsCluster
from tests.conftest import Broker
from tests.waiting import until

pytestmark = pytest.mark.integration

DEP = "lease-announcement"
SPEC = MechanismSpec(mechanism="coco", d=8, s=2, epsilon=1.0)
TTL = 0.9
"""The lease's time to live: renewed (and the announcement subscribed again) every 0.3 s."""
HEARD = 4
"""Times the one announcement must be heard: once live, then again at renewals."""


async def publish_announcement(url: str) -> bytes:
    payload = encode_announcement(SPEC.to_dict(), min_batch=100, delta=1e-6, round_seconds=8)
    address = parse_broker_urls(url)[0]
    async with aiomqtt.Client(
        address.host, address.port, protocol=aiomqtt.ProtocolVersion.V311
    ) as client:
        await client.publish(spec_topic(DEP), payload, qos=1, retain=True)
    return payload


async def hear_it_again(watcher_nodes: str, publisher_node: str) -> list[dict[str, Any]]:
    """Hold a lease through ``watcher_nodes`` while the announcement is published once on
    ``publisher_node``; what the lease connection heard, once :data:`HEARD` times."""
    control = ShardControl(
        nodes=BrokerList(watcher_nodes),
        tls=False,
        ca_file=None,
        username=None,
        password=None,
        client_id="coco-shuffler-lease-announcement-g0s0",
        deployment=DEP,
        shard="g0s0",
        owner="state-directory-id",
        ttl=TTL,
        settle=0.1,
        mqtt5=False,
        timeout=10.0,
    )
    heard: list[dict[str, Any]] = []
    control.on_announcement = heard.append
    stop = asyncio.Event()
    holder = asyncio.create_task(control.hold(stop))
    try:
        await asyncio.sleep(2 * TTL)  # subscribed: nothing retained yet, nothing heard
        assert heard == []
        await publish_announcement(publisher_node)
        await until(lambda: len(heard) >= HEARD or holder.done(), what="the announcement")
    finally:
        stop.set()
        await asyncio.wait_for(holder, 30)
    return heard


def test_the_retained_announcement_is_heard_again_at_each_renewal_on_mosquitto(
    mosquitto: Broker,
) -> None:
    url = f"mqtt://127.0.0.1:{mosquitto.port}"
    heard = asyncio.run(hear_it_again(url, url))
    assert len(heard) >= HEARD
    assert all(h == heard[0] for h in heard)
    assert heard[0]["round_seconds"] == 8


def test_the_retained_announcement_is_heard_again_at_each_renewal_on_a_nats_cluster(
    nats_cluster: NatsCluster,
) -> None:
    urls = nats_cluster.urls
    heard = asyncio.run(hear_it_again(",".join(urls), urls[-1]))  # watcher on n1, publish on n3
    assert len(heard) >= HEARD
    assert all(h == heard[0] for h in heard)
