"""The project's MQTT client libraries against a 3-node NATS cluster (JetStream, MQTT 3.1.1).

For paho-mqtt 2.x, aiomqtt 2.x and gmqtt each: connect, a persistent session
(``clean_session=False``) with a QoS 1 subscription that resumes on *another* node, QoS 1
publish, retained messages, and redelivery of a message left unacknowledged when the
connection died. Then what each library sees when it sends an MQTT 5 CONNECT (NATS's MQTT
listener speaks 3.1.1 only), and the NATS limits that matter to coco-fleet: ' ' in topics
(refused) and '.' (carried), ``max_payload`` (applied to MQTT), ``max_ack_pending`` (flow
control, not loss), and a session taken over by a second connection with the same client id.
The server is the one ``tests/clusters.py`` runs (``NATS_SERVER``).

One cluster serves the module, with ``ack_wait`` 2 s (NATS redelivers an unacknowledged
QoS 1 message after ``ack_wait``, default 30 s, not on reconnection) and ``max_ack_pending``
20 (default 1024), so those behaviours show within seconds. Every test uses its own topics
and client ids.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiomqtt.exceptions import MqttConnectError

from tests.clusters import NatsCluster, nats_cluster_in
from tests.mqtt_adapters import (
    ADAPTERS,
    AiomqttAdapter,
    GmqttAdapter,
    PahoAdapter,
    wait_for,
)

pytestmark = pytest.mark.integration

ACK_WAIT = "2s"
MAX_ACK_PENDING = 20
_ids = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    directory: Path = tmp_path_factory.mktemp("nats-compat")
    with nats_cluster_in(
        directory,
        mqtt={"ack_wait": ACK_WAIT, "max_ack_pending": MAX_ACK_PENDING},
        extra_config="max_payload: 65536",
    ) as started:
        yield started


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}"


LIBRARIES = sorted(ADAPTERS)


@pytest.mark.parametrize("library", LIBRARIES)
def test_persistent_session_resumes_on_another_node(cluster: NatsCluster, library: str) -> None:
    adapter = ADAPTERS[library]
    topic = f"compat/{unique(library)}/reports"
    client_id = unique(f"{library}-sub")
    sub = adapter(cluster.url(0), client_id, clean_session=False)
    sub.connect()
    assert sub.subscribe(topic, qos=1) == 1
    sub.close()  # the session (subscription, queued messages) stays in the cluster

    pub = adapter(cluster.url(1), unique(f"{library}-pub"), clean_session=True)
    pub.connect()
    pub.publish(topic, b"while-away")  # returns on its PUBACK: stored on a quorum
    pub.close()

    back = adapter(cluster.url(2), client_id, clean_session=False)
    back.connect()
    try:
        if back.session_present is not None:  # aiomqtt does not report it
            assert back.session_present
        wait_for(lambda: back.received, what="the queued message")
        assert back.received[0].payload == b"while-away"
    finally:
        back.close()


@pytest.mark.parametrize("library", LIBRARIES)
def test_retained_message_reaches_a_new_subscriber_on_any_node(
    cluster: NatsCluster, library: str
) -> None:
    adapter = ADAPTERS[library]
    topic = f"compat/{unique(library)}/spec"
    pub = adapter(cluster.url(0), unique(f"{library}-ann"), clean_session=True)
    pub.connect()
    pub.publish(topic, b'{"spec": 1}', retain=True)
    pub.close()
    for node in (1, 2):
        for qos in (0, 1):
            sub = adapter(cluster.url(node), unique(f"{library}-dev"), clean_session=True)
            sub.connect()
            try:
                assert sub.subscribe(topic, qos=qos) == qos
                received = sub.received
                wait_for(received.__len__, what="the retained message")
                assert (received[0].topic, received[0].payload) == (topic, b'{"spec": 1}')
                assert received[0].retain
            finally:
                sub.close()


@pytest.mark.parametrize("library", LIBRARIES)
def test_unacknowledged_message_is_redelivered_after_reconnection(
    cluster: NatsCluster, library: str
) -> None:
    adapter = ADAPTERS[library]
    topic = f"compat/{unique(library)}/batches"
    client_id = unique(f"{library}-agg")
    sub = adapter(cluster.url(0), client_id, clean_session=False, ack=False)
    sub.connect()
    assert sub.subscribe(topic, qos=1) == 1
    pub = PahoAdapter(cluster.url(1), unique("pub"), clean_session=True)
    pub.connect()
    pub.publish(topic, b"batch-1")
    pub.close()
    wait_for(lambda: sub.received, what="the first delivery")
    sub.drop()  # a crash: no PUBACK, no DISCONNECT

    again = adapter(cluster.url(2), client_id, clean_session=False)
    again.connect()
    try:
        wait_for(lambda: again.received, what="the redelivery")
        assert again.received[0].payload == b"batch-1"
        if again.received[0].dup is not None:
            assert again.received[0].dup  # redelivered by the consumer: DUP set
    finally:
        again.close()


# -- MQTT 5 CONNECT against a 3.1.1-only listener ------------------------------------------


def mqtt5_connect_packet(client_id: bytes) -> bytes:
    variable = b"\x00\x04MQTT\x05\x02\x00\x1e\x00"  # level 5, clean start, keepalive 30, no props
    body = variable + struct.pack("!H", len(client_id)) + client_id
    return bytes([0x10, len(body)]) + body


def test_raw_mqtt5_connect_gets_a_3_1_1_connack_code_1_then_close(cluster: NatsCluster) -> None:
    """The bytes the listener answers: a 3.1.1 CONNACK, return code 1 (unacceptable protocol
    version), no MQTT 5 properties, then the connection is closed."""
    address = ("127.0.0.1", cluster.node(0).mqtt_port)
    with socket.create_connection(address, timeout=30) as sock:
        sock.settimeout(30)
        sock.sendall(mqtt5_connect_packet(b"raw-v5"))
        answer = b""
        while chunk := sock.recv(64):
            answer += chunk
    assert answer == b"\x20\x02\x00\x01"


def test_paho_mqtt5_sees_reason_0x84_then_a_disconnect(cluster: NatsCluster) -> None:
    client = PahoAdapter(cluster.url(0), unique("paho-v5"), clean_session=True, mqtt5=True)
    with pytest.raises(ConnectionError):
        client.connect()
    wait_for(lambda: bool(client.disconnects), what="the disconnect")
    client.client.loop_stop()
    # paho maps the 3.1.1 return code 1 to MQTT 5's 0x84 for an MQTT 5 client
    assert client.connack.value == 0x84
    assert client.connack.getName() == "Unsupported protocol version"


def test_aiomqtt_mqtt5_raises_connect_error_0x84(cluster: NatsCluster) -> None:
    client = AiomqttAdapter(cluster.url(0), unique("aiomqtt-v5"), clean_session=True, mqtt5=True)
    with pytest.raises(MqttConnectError) as refused:
        client.connect()
    client.close()
    assert getattr(refused.value.rc, "value", refused.value.rc) == 0x84


def test_gmqtt_mqtt5_silently_falls_back_to_3_1_1(cluster: NatsCluster) -> None:
    """With its default configuration gmqtt answers CONNACK code 1 to an MQTT 5 CONNECT by
    connecting again with 3.1.1 by itself: connect() succeeds and only its protocol version
    tells."""
    client = GmqttAdapter(
        cluster.url(0), unique("gmqtt-v5"), clean_session=True, mqtt5=True, gmqtt_reconnects=True
    )
    client.connect()
    try:
        assert client.protocol_version == 4
        topic = f"compat/{unique('gmqtt-v5')}/t"
        assert client.subscribe(topic) == 1
        client.publish(topic, b"over 3.1.1")
        wait_for(lambda: client.received, what="the message")
    finally:
        client.close()


def test_gmqtt_mqtt5_without_its_reconnection_never_completes_connect(
    cluster: NatsCluster, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the shuffler and sim/fleet/ configure gmqtt (``reconnect_retries`` -2), the
    fallback cannot reconnect: gmqtt logs the CONNACK code and gives up, and connect() neither
    returns nor raises. A caller must bound it with a timeout and treat that as a refusal."""
    # an in-process `coco fleet` earlier in the session sets the gmqtt logger to CRITICAL,
    # and broker/service/ingest.py, once imported, withholds the text of gmqtt's records
    caplog.set_level(logging.DEBUG, logger="gmqtt")
    for name in list(logging.root.manager.loggerDict):
        if name == "gmqtt" or name.startswith("gmqtt."):
            monkeypatch.setattr(logging.getLogger(name), "filters", [])
    client = GmqttAdapter(cluster.url(0), unique("gmqtt-v5-norc"), clean_session=True, mqtt5=True)
    future = asyncio.run_coroutine_threadsafe(client.start_connect(), client._runner.loop)
    wait_for(
        lambda: any("max number of failed connection" in r.getMessage() for r in caplog.records),
        what="gmqtt to give up",
    )
    assert any("CONNACK: 0x1" in r.getMessage() for r in caplog.records)
    assert not future.done()
    future.cancel()
    client.close()


# -- NATS limits -------------------------------------------------------------------------


def test_space_in_a_topic_closes_the_connection_without_puback(cluster: NatsCluster) -> None:
    client = PahoAdapter(cluster.url(0), unique("space"), clean_session=True)
    client.connect()
    info = client.client.publish("coco/v1/lab/ingress/dev 1", b"x", qos=1)
    wait_for(lambda: bool(client.disconnects), what="the broker to close the connection")
    client.client.loop_stop()
    assert info.mid not in client.acked


def test_dot_in_a_topic_is_carried_as_an_ordinary_character(cluster: NatsCluster) -> None:
    """Since NATS 2.10 a ``.`` in an MQTT topic level is carried (NATS 2.9 closed the
    connection of such a PUBLISH and refused such a SUBSCRIBE with 0x80)."""
    prefix = f"compat/{unique('dot')}"
    sub = PahoAdapter(cluster.url(1), unique("dot-sub"), clean_session=True)
    sub.connect()
    pub = PahoAdapter(cluster.url(0), unique("dot-pub"), clean_session=True)
    pub.connect()
    try:
        assert sub.subscribe(f"{prefix}/a.b/batches") == 1
        pub.publish(f"{prefix}/a.b/batches", b"dotted")
        wait_for(lambda: sub.received, what="the message on the dotted topic")
        assert [(m.topic, m.payload) for m in sub.received] == [
            (f"{prefix}/a.b/batches", b"dotted")
        ]
    finally:
        pub.close()
        sub.close()


def test_max_ack_pending_holds_back_the_rest_until_acknowledged(cluster: NatsCluster) -> None:
    """A subscriber with ``max_ack_pending`` messages unacknowledged gets no new ones (the
    server redelivers the same ones after ack_wait); once it acknowledges, the rest come.
    Nothing is lost."""
    topic = f"compat/{unique('window')}/x"
    client_id = unique("window-sub")
    slow = PahoAdapter(cluster.url(0), client_id, clean_session=False, ack=False)
    slow.connect()
    slow.subscribe(topic)
    pub = PahoAdapter(cluster.url(1), unique("window-pub"), clean_session=True)
    pub.connect()
    total = MAX_ACK_PENDING + 10
    for i in range(total):
        pub.publish(topic, b"%d" % i)
    pub.close()

    def consumer() -> dict[str, int]:
        for node in cluster.running():
            jsz = cluster.monitor(
                node.name, "jsz", accounts="true", streams="true", consumers="true", config="true"
            )
            for account in jsz.get("account_details") or []:
                for stream in account.get("stream_detail") or []:
                    for detail in stream.get("consumer_detail") or []:
                        subject = detail.get("config", {}).get("filter_subject", "")
                        leader = (detail.get("cluster") or {}).get("leader")
                        # the leader's counts: a follower's num_ack_pending stays 0
                        if subject.endswith(topic.replace("/", ".")) and leader == node.name:
                            return {
                                "ack_pending": int(detail.get("num_ack_pending", 0)),
                                "pending": int(detail.get("num_pending", 0)),
                            }
        return {}

    seen: list[dict[str, int]] = []

    def window_full() -> bool:
        seen.append(consumer())
        return seen[-1] == {"ack_pending": MAX_ACK_PENDING, "pending": 10}

    wait_for(window_full, what="the window to fill")
    assert len({m.payload for m in slow.received}) == MAX_ACK_PENDING
    slow.drop()

    fast = PahoAdapter(cluster.url(2), client_id, clean_session=False)
    fast.connect()
    try:
        wait_for(
            lambda: (
                len({m.payload for m in fast.received} | {m.payload for m in slow.received})
                == total
            ),
            what="every message",
        )
    finally:
        fast.close()


def test_second_connection_with_the_same_client_id_takes_the_session_over(
    cluster: NatsCluster,
) -> None:
    """On another node too: the first connection is closed (3.1.1 has no DISCONNECT from
    the server, so the client only sees its socket close), the second gets the session."""
    client_id = unique("takeover")
    topic = f"compat/{client_id}/x"
    first = PahoAdapter(cluster.url(0), client_id, clean_session=False)
    first.connect()
    first.subscribe(topic)
    second = PahoAdapter(cluster.url(1), client_id, clean_session=False)
    second.connect()
    try:
        assert second.session_present
        wait_for(lambda: bool(first.disconnects), what="the first connection to be closed")
        assert first.disconnects[0].getName() == "Unspecified error"  # no DISCONNECT packet
        pub = PahoAdapter(cluster.url(2), unique("takeover-pub"), clean_session=True)
        pub.connect()
        pub.publish(topic, b"to-the-new-holder")
        pub.close()
        wait_for(lambda: second.received, what="delivery to the new holder")
    finally:
        first.client.loop_stop()
        second.close()


def test_max_payload_limits_mqtt_publishes(cluster: NatsCluster) -> None:
    """``max_payload: 65536`` binds the MQTT listener too (NATS 2.9 applied it to NATS
    clients only): a larger PUBLISH is never acknowledged and its connection is closed,
    while one below the limit is stored and delivered. The shuffler's largest batch
    (``MAX_BATCH_LIMIT`` records, 240,094 bytes) is under NATS's default of 1 MiB."""
    topic = f"compat/{unique('big')}/x"
    sub = PahoAdapter(cluster.url(1), unique("big-sub"), clean_session=True)
    sub.connect()
    sub.subscribe(topic)
    pub = PahoAdapter(cluster.url(0), unique("big-pub"), clean_session=True)
    pub.connect()
    try:
        pub.publish(topic, b"x" * 60_000)
        wait_for(lambda: sub.received, what="the message under max_payload")
        assert len(sub.received[0].payload) == 60_000
        info = pub.client.publish(topic, b"x" * 70_000, qos=1)
        wait_for(lambda: bool(pub.disconnects), what="the broker to close the connection")
        pub.client.loop_stop()
        assert info.mid not in pub.acked
    finally:
        pub.client.disconnect()
        sub.close()
