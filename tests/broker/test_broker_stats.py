"""broker/service/broker_stats.py against a real Mosquitto: the loss that happens after a PUBACK
(a persistent session's queue over ``max_queued_messages``) shows in the metrics."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import aiomqtt
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from prometheus_client import CollectorRegistry

from broker.service.broker_stats import (
    DROPPED_TOPIC,
    DROPPED_WARNING,
    MosquittoSysStats,
    parse_sys_value,
)
from tests import waiting
from tests.asyncutil import run
from tests.conftest import MOSQUITTO, Broker, free_port

QUEUE_LIMIT = 5
TOPIC = "coco/v1/lab/ingress/dev-1"
DROPPED = "coco_mosquitto_publish_messages_dropped_total"


@pytest.fixture
def small_queue_broker(tmp_path: Path) -> Iterator[Broker]:
    """$SYS every second and a queue limit of 5 per session (later lines win)."""
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed")
    broker = Broker(
        tmp_path, free_port(), extra_config=f"sys_interval 1\nmax_queued_messages {QUEUE_LIMIT}\n"
    )
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def overflow_an_offline_session(broker: Broker, messages: int) -> int:
    """A persistent session subscribes and goes away; ``messages`` QoS 1 reports are then
    published to it. Returns how many PUBACKs the publisher got."""
    sub = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id="shuffler",
        protocol=mqtt.MQTTv311,
        clean_session=False,
    )
    subscribed = threading.Event()
    sub.on_subscribe = lambda *_a: subscribed.set()
    sub.connect("127.0.0.1", broker.port)
    sub.loop_start()
    sub.subscribe("coco/v1/lab/ingress/+", qos=1)
    assert subscribed.wait(30)
    sub.disconnect()
    sub.loop_stop()
    acked: set[int] = set()
    pub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="dev-1", protocol=mqtt.MQTTv311)
    pub.on_publish = lambda _c, _u, mid, _rc, _p: acked.add(mid)
    pub.connect("127.0.0.1", broker.port)
    pub.loop_start()
    infos = [pub.publish(TOPIC, bytes(16), qos=1) for _ in range(messages)]
    for info in infos:
        info.wait_for_publish(30)
    pub.disconnect()
    pub.loop_stop()
    return sum(1 for info in infos if info.mid in acked)


async def wait_for_sample(
    registry: CollectorRegistry, name: str, holds: Callable[[float], bool]
) -> None:
    """Poll until the sample ``name`` exists and ``holds``; fails when it stood still for
    60 s (tests/waiting.py)."""

    def sample() -> float | None:
        return registry.get_sample_value(name)

    def done() -> bool:
        value = sample()
        return value is not None and holds(value)

    await waiting.until(done, progress=sample, stall=60, what=name, interval=0.05)


def test_parse_sys_value() -> None:
    assert parse_sys_value(b"5") == 5.0
    assert parse_sys_value("12 seconds") == 12.0
    assert parse_sys_value(b"0.25") == 0.25
    assert parse_sys_value(b"mosquitto version 2.0.11") is None


def test_dropped_after_puback_shows_on_its_own_connection(
    small_queue_broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="broker.broker_stats")
    registry = CollectorRegistry()
    stats = MosquittoSysStats(registry)
    assert registry.get_sample_value(DROPPED) is None

    async def scenario() -> None:
        watcher = asyncio.create_task(stats.watch(small_queue_broker.url, retry_seconds=0.2))
        try:
            await wait_for_sample(registry, DROPPED, lambda v: v == 0)
            acked = await asyncio.to_thread(overflow_an_offline_session, small_queue_broker, 12)
            assert acked == 12  # every report was acknowledged ...
            # ... and 7 of them dropped by the broker: visible only here
            await wait_for_sample(registry, DROPPED, lambda v: v == 7)
            await wait_for_sample(
                registry, "coco_mosquitto_store_messages", lambda v: v >= QUEUE_LIMIT
            )
            await wait_for_sample(registry, "coco_mosquitto_clients_disconnected", lambda v: v == 1)
            assert registry.get_sample_value("coco_mosquitto_uptime_seconds") is not None
            assert registry.get_sample_value("coco_mosquitto_sys_last_update_timestamp_seconds")
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    run(scenario(), timeout=180)
    # each increase said once at WARNING, with what it means; together, the 7 dropped
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings, caplog.text
    assert all(r.msg == DROPPED_WARNING for r in warnings)
    increases = [cast(tuple[int, int], r.args) for r in warnings]
    assert sum(increase for increase, _ in increases) == 7
    assert increases[-1][1] == 7  # the broker's count since it started
    assert "acknowledged reports" in warnings[0].getMessage()
    assert "raise max_queued_messages" in warnings[0].getMessage()


def test_each_increase_of_the_dropped_counter_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="broker.broker_stats")
    stats = MosquittoSysStats(CollectorRegistry())
    stats.handle(DROPPED_TOPIC, b"3")  # already there: INFO, not this run's loss for sure
    stats.handle(DROPPED_TOPIC, b"3")  # unchanged: nothing
    stats.handle(DROPPED_TOPIC, b"10")
    stats.handle(DROPPED_TOPIC, b"2")  # the broker restarted: 2 new
    levels = [(r.levelno, r.args) for r in caplog.records]
    assert levels == [
        (logging.INFO, (3,)),
        (logging.WARNING, (7, 10)),
        (logging.WARNING, (2, 2)),
    ]


def test_on_a_shared_client_only_sys_messages_are_taken(small_queue_broker: Broker) -> None:
    registry = CollectorRegistry()
    stats = MosquittoSysStats(registry)
    others: list[str] = []

    async def scenario() -> None:
        async with aiomqtt.Client(
            "127.0.0.1", small_queue_broker.port, protocol=aiomqtt.ProtocolVersion.V311
        ) as client:
            await stats.subscribe(client)
            await client.subscribe("app/#", qos=1)
            await client.publish("app/x", b"payload", qos=1)
            async with asyncio.timeout(60):
                async for message in client.messages:
                    payload = message.payload
                    assert isinstance(payload, bytes)
                    if not stats.handle(message.topic.value, payload):
                        others.append(message.topic.value)
                    if others and stats.value("$SYS/broker/uptime") is not None:
                        break

    run(scenario(), timeout=120)
    assert others == ["app/x"]
    assert registry.get_sample_value("coco_mosquitto_uptime_seconds") is not None
    assert not stats.handle("coco/v1/lab/batches", b"1")


def test_watch_retries_until_the_broker_is_up(tmp_path: Path) -> None:
    """Started before its broker, the watcher connects once the broker listens."""
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed")
    broker = Broker(tmp_path, free_port(), extra_config="sys_interval 1\n")
    registry = CollectorRegistry()
    stats = MosquittoSysStats(registry)

    async def scenario() -> None:
        watcher = asyncio.create_task(stats.watch(broker.url, retry_seconds=0.1))
        try:
            await asyncio.sleep(0.3)  # the watcher fails at least once
            await asyncio.to_thread(broker.start)
            async with asyncio.timeout(60):
                while stats.value("$SYS/broker/uptime") is None:
                    await asyncio.sleep(0.05)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    try:
        run(scenario(), timeout=120)
    finally:
        broker.stop()


def test_watch_takes_a_node_list_and_moves_past_a_node_that_is_down(
    small_queue_broker: Broker,
) -> None:
    """``--broker`` as a cluster's node list: the first node refuses connections, so the
    watcher moves on to the next and its statistics arrive."""
    registry = CollectorRegistry()
    stats = MosquittoSysStats(registry)
    nodes = f"mqtt://127.0.0.1:{free_port()},{small_queue_broker.url}"

    async def scenario() -> None:
        watcher = asyncio.create_task(stats.watch(nodes, retry_seconds=0.1))
        try:
            await wait_for_sample(registry, "coco_mosquitto_uptime_seconds", lambda v: v >= 0)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    run(scenario(), timeout=120)
