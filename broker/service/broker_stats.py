"""Mosquitto's ``$SYS`` counters that reveal broker-side loss, as Prometheus metrics.

Mosquitto acknowledges a QoS 1 report and may still lose it: beyond ``max_queued_messages``
for an offline persistent session it drops the message *after* the PUBACK (counted in
``$SYS/broker/publish/messages/dropped``), and a ``kill -9`` loses what it held since its
last autosave. Nothing in coco-fleet can see either from the messages themselves; these
counters make the first visible and give the size of the second's exposure (what is
stored). Checked against Mosquitto 2.0.11 (tests/broker/test_broker_stats.py):

=========================================  ==============================================
``$SYS`` topic                             metric
=========================================  ==============================================
``$SYS/broker/publish/messages/dropped``   ``coco_mosquitto_publish_messages_dropped_total``
``$SYS/broker/publish/messages/received``  ``coco_mosquitto_publish_messages_received_total``
``$SYS/broker/store/messages/count``       ``coco_mosquitto_store_messages`` (queued/retained)
``$SYS/broker/store/messages/bytes``       ``coco_mosquitto_store_bytes``
``$SYS/broker/clients/disconnected``       ``coco_mosquitto_clients_disconnected`` (persistent
                                           sessions whose client is away)
``$SYS/broker/uptime``                     ``coco_mosquitto_uptime_seconds`` (a drop to a small
                                           value means a restart: the counters restart too)
=========================================  ==============================================

plus ``coco_mosquitto_sys_last_update_timestamp_seconds`` (when a ``$SYS`` message last
arrived; absent until then). Each increase of the dropped counter is also logged, once, at
WARNING with the increase (:data:`DROPPED_WARNING`): the broker sends the counter at most
once per ``sys_interval``, so neither can that line come more often; a value already there
when the watch starts is said once at INFO (the broker's count since it started, not
necessarily this run's loss). A metric is absent until its first ``$SYS`` message. The broker
publishes them every ``sys_interval`` seconds (Mosquitto's default 10). The counters are the
broker's own since it started: ``increase()`` over them handles a broker restart.

Usage, on a connection of its own (reconnects until cancelled)::

    registry = CollectorRegistry()
    stats = MosquittoSysStats(registry)
    task = asyncio.create_task(stats.watch("mqtt://broker:1883", username=..., password=...))

or on an aiomqtt client the caller already runs (it routes the messages)::

    await stats.subscribe(client)
    async for message in client.messages:
        if stats.handle(message.topic.value, message.payload):
            continue
        ...

The account needs read access to ``$SYS/broker/#`` (a dynamic-security role's
``subscribePattern`` and ``receivePattern`` ACLs). Brokers without ``$SYS`` (NATS) send
nothing: the metrics stay absent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import aiomqtt
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from edge.mqtt_url import BrokerList

logger = logging.getLogger("broker.broker_stats")  # a fixed name: broker/__init__.py, "Loggers"


@dataclass(frozen=True)
class SysMetric:
    topic: str
    name: str
    help: str
    counter: bool


SYS_METRICS: tuple[SysMetric, ...] = (
    SysMetric(
        "$SYS/broker/publish/messages/dropped",
        "coco_mosquitto_publish_messages_dropped",
        "PUBLISH messages the broker dropped since it started (a persistent session's queue "
        "at max_queued_messages: dropped after their PUBACK)",
        True,
    ),
    SysMetric(
        "$SYS/broker/publish/messages/received",
        "coco_mosquitto_publish_messages_received",
        "PUBLISH messages the broker received since it started",
        True,
    ),
    SysMetric(
        "$SYS/broker/store/messages/count",
        "coco_mosquitto_store_messages",
        "messages the broker holds (queued for sessions, in flight, retained)",
        False,
    ),
    SysMetric(
        "$SYS/broker/store/messages/bytes",
        "coco_mosquitto_store_bytes",
        "payload bytes of the messages the broker holds",
        False,
    ),
    SysMetric(
        "$SYS/broker/clients/disconnected",
        "coco_mosquitto_clients_disconnected",
        "persistent sessions whose client is not connected",
        False,
    ),
    SysMetric(
        "$SYS/broker/uptime",
        "coco_mosquitto_uptime_seconds",
        "seconds since the broker started",
        False,
    ),
)
_BY_TOPIC = {metric.topic: metric for metric in SYS_METRICS}
DROPPED_TOPIC = SYS_METRICS[0].topic

DROPPED_WARNING = (
    "the broker dropped %d PUBLISH messages after acknowledging them (%d since it started; "
    "coco_mosquitto_publish_messages_dropped_total): acknowledged reports (or batches) lost "
    "at the broker, a persistent session's queue full while its client was away; raise "
    "max_queued_messages in mosquitto.conf"
)


def parse_sys_value(payload: bytes | bytearray | str) -> float | None:
    """The number a ``$SYS`` message carries (``"5"``, ``"12 seconds"``), or None."""
    text = payload.decode("utf-8", "replace") if isinstance(payload, bytes | bytearray) else payload
    head = text.strip().split(" ", 1)[0]
    try:
        return float(head)
    except ValueError:
        return None


class MosquittoSysStats(Collector):
    """Collects the last value of each ``$SYS`` topic of :data:`SYS_METRICS` and exposes
    them on ``registry`` (counters as counters, the rest as gauges)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._values: dict[str, float] = {}
        self.last_update: float | None = None
        registry.register(self)

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(metric.topic for metric in SYS_METRICS)

    def value(self, topic: str) -> float | None:
        """The last value received on ``topic``, or None."""
        return self._values.get(topic)

    def handle(self, topic: str, payload: bytes | bytearray | str) -> bool:
        """Take a message if it is one of ours: True for a ``$SYS`` topic we track (its
        value stored when it parses), False for anything else."""
        if topic not in _BY_TOPIC:
            return False
        value = parse_sys_value(payload)
        if value is None:
            logger.debug("unparsable %s: %r", topic, payload)
            return True
        if topic == DROPPED_TOPIC:
            self._log_dropped(self._values.get(topic), value)
        self._values[topic] = value
        self.last_update = time.time()
        return True

    @staticmethod
    def _log_dropped(before: float | None, now: float) -> None:
        """A WARNING for each increase of the dropped counter; a smaller value is a broker
        restart (its counters restart: all it counts is new)."""
        if before is None:
            if now > 0:
                logger.info(
                    "the broker has dropped %d PUBLISH messages since it started "
                    "(coco_mosquitto_publish_messages_dropped_total)",
                    int(now),
                )
            return
        increase = now - before if now >= before else now
        if increase > 0:
            logger.warning(DROPPED_WARNING, int(increase), int(now))

    async def subscribe(self, client: aiomqtt.Client) -> None:
        """Subscribe ``client`` (connected) to the tracked topics, QoS 0."""
        await client.subscribe([(topic, 0) for topic in self.topics])

    async def run(self, client: aiomqtt.Client) -> None:
        """Subscribe and handle messages until the connection ends (``aiomqtt.MqttError``)
        or the task is cancelled. Use on a client that carries nothing else."""
        await self.subscribe(client)
        async for message in client.messages:
            payload = message.payload
            if isinstance(payload, bytes | bytearray | str):
                self.handle(message.topic.value, payload)

    async def watch(
        self,
        broker: str,
        *,
        username: str | None = None,
        password: str | None = None,
        client_id: str = "",
        retry_seconds: float = 5.0,
    ) -> None:
        """Run on a connection of its own to ``broker`` (``mqtt://`` or ``mqtts://``, or a
        cluster's nodes separated by commas; MQTT 3.1.1, clean session), reconnecting every
        ``retry_seconds`` after a failure, to the next node of a list, until cancelled. A
        broker that publishes no ``$SYS`` statistics (a NATS cluster) leaves the metrics
        absent."""
        nodes = BrokerList(broker)
        while True:
            address = nodes.current
            try:
                async with aiomqtt.Client(
                    address.host,
                    address.port,
                    username=username,
                    password=password,
                    identifier=client_id or None,
                    protocol=aiomqtt.ProtocolVersion.V311,
                    clean_session=True,
                    tls_params=aiomqtt.TLSParameters() if address.tls else None,
                    keepalive=30,
                ) as client:
                    await self.run(client)
            except aiomqtt.MqttError as exc:
                logger.warning(
                    "$SYS statistics from %s:%d unavailable: %s", address.host, address.port, exc
                )
                nodes.failed()
            await asyncio.sleep(retry_seconds)

    def collect(self) -> Iterator[Metric]:
        for metric in SYS_METRICS:
            value = self._values.get(metric.topic)
            if value is None:
                continue
            family: Metric
            if metric.counter:
                family = CounterMetricFamily(metric.name, metric.help, value=value)
            else:
                family = GaugeMetricFamily(metric.name, metric.help, value=value)
            yield family
        if self.last_update is not None:
            yield GaugeMetricFamily(
                "coco_mosquitto_sys_last_update_timestamp_seconds",
                "when a $SYS statistics message last arrived (Unix time)",
                value=self.last_update,
            )
