"""The NATS cluster fixture itself, and the property issue 17 asks of the broker: kill -9 of
any one node mid-run loses no acknowledged QoS 1 report.

Reports go from 4 MQTT 3.1.1 connections spread over the nodes to one persistent-session
subscriber on node 1; every client fails over to the next node's URL when its connection
ends. A node (another one, or the subscriber's own) is killed once a third of the reports
are acknowledged. Every report a publisher got a PUBACK for must reach the subscriber;
duplicates are allowed (QoS 1: in-flight messages are redelivered after ``ack_wait``, here
3 s instead of the default 30 s so the test does not wait half a minute).
"""

from __future__ import annotations

import struct
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from tests.clusters import NatsCluster, nats_cluster_in
from tests.mqtt_adapters import FailoverClient, PahoAdapter, wait_for

pytestmark = pytest.mark.integration

TOPIC = "coco/v1/lab/ingress"
PUBLISHERS = 4
PER_PUBLISHER = 400


def test_fixture_starts_kills_and_restarts_nodes(nats_cluster: NatsCluster) -> None:
    names = [node.name for node in nats_cluster.nodes]
    assert names == ["n1", "n2", "n3"]
    assert len(set(nats_cluster.urls)) == 3
    assert all(url.startswith("mqtt://127.0.0.1:") for url in nats_cluster.urls)
    assert nats_cluster.meta_leader() in names
    assert all(nats_cluster.healthz(name, server_only=True)[0] for name in names)

    nats_cluster.kill("n2")
    assert not nats_cluster.node("n2").running
    nats_cluster.wait_ready()  # the two others: a leader among them
    assert nats_cluster.meta_leader() in {"n1", "n3"}

    nats_cluster.start(1)  # the same node by index, on its ports and store
    assert nats_cluster.healthz("n2", server_only=True)[0]
    assert nats_cluster.log("n2").count("Server is ready") == 2  # started twice
    logs = nats_cluster.logs()
    assert all(f"--- {name} " in logs for name in names)


def test_a_restarted_node_rejoins_the_quorum(nats_cluster: NatsCluster) -> None:
    """Kill n1, start it again, then kill n3: n1 and n2 must now be the quorum of every
    stream, so a QoS 1 PUBLISH through n1 is still acknowledged and the persistent session
    (subscribed before all this) gets it on n2."""
    sub = PahoAdapter(nats_cluster.url("n2"), "coco-aggregator-lab", clean_session=False)
    sub.connect()
    assert sub.subscribe("coco/v1/lab/batches") == 1
    sub.close()
    nats_cluster.kill("n1")
    nats_cluster.wait_ready()
    nats_cluster.start("n1")
    nats_cluster.kill("n3")
    nats_cluster.wait_ready()
    pub = PahoAdapter(nats_cluster.url("n1"), "coco-shuffler-lab", clean_session=True)
    pub.connect()
    pub.publish("coco/v1/lab/batches", b"batch after two faults")  # needs n1 and n2
    pub.close()
    back = PahoAdapter(nats_cluster.url("n2"), "coco-aggregator-lab", clean_session=False)
    back.connect()
    try:
        assert back.session_present
        wait_for(lambda: back.received, what="the batch")
        assert back.received[0].payload == b"batch after two faults"
    finally:
        back.close()


@pytest.fixture
def quick_redelivery_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    with nats_cluster_in(tmp_path / "nats", mqtt={"ack_wait": "3s"}) as cluster:
        yield cluster


def payload(publisher: int, seq: int) -> bytes:
    return struct.pack("!IQI", publisher, seq, 0)  # 16 bytes like a report, unique


class Subscriber:
    """A persistent-session QoS 1 subscriber that fails over between the nodes."""

    def __init__(self, urls: list[str]) -> None:
        self.seen: Counter[bytes] = Counter()
        self.lock = threading.Lock()
        self.subscribed = threading.Event()
        self.client = FailoverClient(
            urls, 0, "coco-shuffler-lab", clean_session=False, on_connected=self._subscribe
        )
        self.client.client.on_message = self._on_message
        self.client.client.on_subscribe = self._on_subscribe

    def _subscribe(self, client: mqtt.Client) -> None:
        client.subscribe(f"{TOPIC}/+", qos=1)

    def _on_subscribe(self, client: mqtt.Client, _u: Any, _m: int, codes: Any, _p: Any) -> None:
        if any(code.is_failure for code in codes):
            self._subscribe(client)  # refused while leaders are elected: ask again
        else:
            self.subscribed.set()

    def _on_message(self, _c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.seen[bytes(message.payload)] += 1


@pytest.mark.parametrize("victim", [1, 0], ids=["another-node", "the-subscribers-node"])
def test_kill_9_of_one_node_loses_no_acknowledged_report(
    quick_redelivery_cluster: NatsCluster, victim: int
) -> None:
    cluster = quick_redelivery_cluster
    sub = Subscriber(cluster.urls)
    assert sub.subscribed.wait(120)
    acked: list[set[int]] = [set() for _ in range(PUBLISHERS)]
    mids: list[dict[int, int]] = [{} for _ in range(PUBLISHERS)]
    publishers = []
    for i in range(PUBLISHERS):
        fc = FailoverClient(cluster.urls, i, f"dev-{i}", clean_session=True, inflight=20)

        def on_publish(_c: Any, _u: Any, mid: int, _rc: Any, _p: Any, i: int = i) -> None:
            acked[i].add(mid)

        fc.client.on_publish = on_publish
        assert fc.connected.wait(120)
        publishers.append(fc)
    try:
        for seq in range(PER_PUBLISHER):
            for i, fc in enumerate(publishers):
                mids[i][fc.client.publish(f"{TOPIC}/dev-{i}", payload(i, seq), qos=1).mid] = seq
        total = PUBLISHERS * PER_PUBLISHER
        wait_for(lambda: sum(map(len, acked)) >= total // 3, what="a third acknowledged")
        cluster.kill(victim)
        wait_for(lambda: sum(map(len, acked)) == total, 300, what="every PUBACK")
        expected = {payload(i, mids[i][mid]) for i in range(PUBLISHERS) for mid in acked[i]}
        assert len(expected) == total

        def missing() -> set[bytes]:
            with sub.lock:
                return expected - set(sub.seen)

        wait_for(lambda: not missing(), 300, what="every acknowledged report")
    finally:
        for fc in publishers:
            fc.close()
        sub.client.close()
    if victim == 0:
        assert sub.client.connects >= 2  # it did fail over
