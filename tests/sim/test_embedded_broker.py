"""The embedded amqtt broker (``sim.demo.embedded_broker``) and ``coco demo --embedded-broker``.

No external process: these run wherever the Python dependencies are installed.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import threading
import time

import aiomqtt
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from typer.testing import CliRunner

from sim.cli import app
from sim.demo import brokers
from sim.demo.brokers import EMBEDDED_BROKER_KIND, EMBEDDED_DEFAULT_DEVICES
from sim.demo.config import DemoConfig
from sim.demo.embedded_broker import EmbeddedBroker
from sim.demo.pipeline import run_pipeline


def _port_is_closed(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return False
    except OSError:
        return True


@pytest.mark.timeout(30)
@pytest.mark.parametrize("threaded", [True, False], ids=["threaded", "in-loop"])
def test_qos1_message_between_aiomqtt_and_paho(threaded: bool) -> None:
    """An aiomqtt publisher and a paho (MQTT 3.1.1) subscriber exchange a QoS 1 message."""
    received: list[tuple[str, bytes, int]] = []
    subscribed, got = threading.Event(), threading.Event()

    async def main() -> int:
        async with EmbeddedBroker(threaded=threaded) as broker:
            assert broker.url == f"mqtt://127.0.0.1:{broker.port}"
            assert broker.port > 0
            sub = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)

            def on_connect(client: paho.Client, *_: object) -> None:
                client.subscribe("coco/test/#", qos=1)

            def on_subscribe(*_: object) -> None:
                subscribed.set()

            def on_message(_c: paho.Client, _u: object, msg: paho.MQTTMessage) -> None:
                received.append((msg.topic, bytes(msg.payload), msg.qos))
                got.set()

            sub.on_connect = on_connect
            sub.on_subscribe = on_subscribe
            sub.on_message = on_message
            sub.connect("127.0.0.1", broker.port, keepalive=10)
            sub.loop_start()
            try:
                assert await asyncio.to_thread(subscribed.wait, 10)
                async with aiomqtt.Client("127.0.0.1", broker.port, timeout=10) as pub:
                    await pub.publish("coco/test/a", b"\x01\x02report", qos=1, timeout=10)
                assert await asyncio.to_thread(got.wait, 10)
            finally:
                sub.disconnect()
                sub.loop_stop()
            port: int = broker.port
        return port

    port = asyncio.run(asyncio.wait_for(main(), 25))
    assert received == [("coco/test/a", b"\x01\x02report", 1)]
    assert _port_is_closed(port)  # stopped cleanly: the listener is gone


@pytest.mark.timeout(30)
def test_two_brokers_pick_free_ports_and_refuse_non_loopback_hosts() -> None:
    async def main() -> None:
        async with EmbeddedBroker() as one, EmbeddedBroker() as two:
            assert one.port != two.port
        with pytest.raises(RuntimeError, match="not running"):
            _ = one.url

    asyncio.run(asyncio.wait_for(main(), 25))
    with pytest.raises(ValueError, match="loopback only"):
        EmbeddedBroker(host="0.0.0.0")
    EmbeddedBroker(host="::1")  # loopback IPv6 is fine (not started)


@pytest.mark.timeout(30)
def test_mqtt5_clients_cannot_use_the_embedded_broker() -> None:
    """Why the demo's services speak MQTT 3.1.1 there: amqtt refuses a bare MQTT 5 CONNECT and
    never answers one with a session expiry property (the client times out)."""

    async def main() -> None:
        async with EmbeddedBroker() as broker:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = 60
            for props in (None, properties):
                client = aiomqtt.Client(
                    "127.0.0.1",
                    broker.port,
                    protocol=aiomqtt.ProtocolVersion.V5,
                    properties=props,
                    timeout=1,
                )
                with pytest.raises(aiomqtt.MqttError):
                    async with client:
                        pass

    asyncio.run(asyncio.wait_for(main(), 25))


def cpu_seconds() -> float:
    """CPU time of this process (all its threads) and of its children waited for."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


README_DEMO_CPU = 8.0
"""The README's measured CPU time of `scripts/demo`'s pipeline step on the embedded broker,
1,000 devices x 3 rounds (8-9 s; its wall-clock time is bench/bench_demo.py's to measure)."""


@pytest.mark.integration  # a whole pipeline in real time
@pytest.mark.timeout(300)
def test_demo_cli_on_the_embedded_broker_accounts_for_every_report() -> None:
    """400 reports through the embedded broker, all accounted for. Its cost is checked in
    CPU time, which a loaded machine does not stretch: less than the README's whole
    3,000-report demo step (a service that spins while idle, as the checkpoint loop once
    did, burns more than that while the rounds pass)."""
    start = cpu_seconds()
    result = CliRunner().invoke(
        app,
        [
            "demo",
            "--embedded-broker",
            "--devices",
            "200",
            "--rounds",
            "2",
            "--min-batch",
            "100",
            "--timeout",
            "60",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout[result.stdout.index("{") :])
    assert doc["broker"].startswith(f"{EMBEDDED_BROKER_KIND} at mqtt://127.0.0.1:")
    assert doc["reports_sent"] == 400
    assert (
        doc["reports_sent"]
        == doc["reports_aggregated"] + doc["reports_rejected"] + doc["reports_dropped"]
    )
    assert doc["reports_unaccounted"] == 0
    assert doc["reports_aggregated"] == 400  # a healthy run loses nothing
    assert "note" not in doc  # --devices given: no automatic reduction
    assert cpu_seconds() - start < README_DEMO_CPU


@pytest.mark.integration  # a whole pipeline in real time
@pytest.mark.timeout(90)
def test_without_mosquitto_the_fallback_runs_a_reduced_default_fleet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No Mosquitto binary: the embedded broker runs, and without an explicit fleet size
    the fleet is ``EMBEDDED_DEFAULT_DEVICES``, with a note saying so."""
    monkeypatch.setattr(brokers, "find_mosquitto", lambda: None)
    config = DemoConfig(
        devices=EMBEDDED_DEFAULT_DEVICES + 500,
        auto_devices=True,
        rounds=1,
        progress=False,
        timeout=60,
    )
    run = asyncio.run(run_pipeline(config))
    doc = run.result
    assert doc["broker"].startswith(EMBEDDED_BROKER_KIND)
    assert doc["devices"] == EMBEDDED_DEFAULT_DEVICES
    assert doc["reports_sent"] == EMBEDDED_DEFAULT_DEVICES
    assert doc["reports_unaccounted"] == 0
    assert f"to {EMBEDDED_DEFAULT_DEVICES} devices" in doc["note"]
