"""Resilience of the whole pipeline over a real Mosquitto (no mocks).

* Aggregator restart mid-stream: the service is stopped gracefully (final checkpoint, then
  PUBACKs), batches keep flowing into its persistent session, and a new service resumes
  from the checkpoint: its sums equal an offline :class:`AggregateState` of every batch the
  shuffler released, and no batch is counted twice.
* Broker restart mid-stream (Mosquitto with ``persistence true``): devices keep publishing
  (the publisher waits for paho's reconnection), the shuffler (persistent session) and the
  aggregator reconnect, and every report a device got a PUBACK for is aggregated, rejected
  by reason or dropped/buffered by reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import aiomqtt
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from prometheus_client import CollectorRegistry

from aggregator.estimation.estimators import AggregateState
from aggregator.service.config import AggregatorConfig
from aggregator.service.service import Aggregator
from broker.service.metrics import DROP_REASONS, REJECT_REASONS
from broker.service.shuffler import Shuffler, ShufflerConfig
from edge import MechanismSpec
from edge.batch_auth import SIGNATURE_SIZE, BatchSigner
from edge.codec import decode_batch
from edge.ledger import BudgetLedger
from edge.publisher import DevicePublisher, PublisherConfig
from edge.topics import batches_topic
from tests import asyncutil, waiting
from tests.asyncutil import value
from tests.conftest import Broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
T = TypeVar("T")

SPEC = MechanismSpec(mechanism="collision", d=8, s=2, epsilon=1.0)
DEVICES = 24
MIN_BATCH = 8


def run(coro: Coroutine[Any, Any, T], timeout: float = 75.0) -> T:
    return asyncutil.run(coro, timeout)


wait_until = waiting.Waits(20.0).until


class Fleet:
    """``DEVICES`` real :class:`DevicePublisher` s, publishing one report per round each,
    concurrently from a thread pool (paho is blocking). Rounds are 1 s of the clock: each
    publisher waits for a round it has not reported in."""

    def __init__(self, broker: Broker, deployment: str, workdir: Path) -> None:
        self.pool = ThreadPoolExecutor(max_workers=DEVICES)
        self.rng = random.Random(7)
        self.publishers = [
            DevicePublisher(
                PublisherConfig(
                    broker=broker.url,
                    deployment=deployment,
                    device_id=f"dev-{i:03d}",
                    publish_timeout=20.0,
                    connect_timeout=10.0,
                    reconnect_min_delay=1,
                    reconnect_max_delay=1,
                ),
                ledger=BudgetLedger(workdir / f"ledger-{i}.json", total_epsilon=1000.0),
                spec=SPEC,
                round_seconds=1,
            )
            for i in range(DEVICES)
        ]
        self.acked = 0
        self.failed: list[str] = []

    def start(self) -> None:
        list(self.pool.map(lambda pub: pub.start(), self.publishers))

    def close(self) -> None:
        for pub in self.publishers:
            pub.close()
        self.pool.shutdown(wait=True)

    def _publish(self, pub: DevicePublisher) -> bool:
        keys = sorted(self.rng.sample(range(SPEC.d), SPEC.s))
        signs = [self.rng.choice((-1, 1)) for _ in keys]
        try:
            return pub.publish_keys(keys, signs)
        except Exception as exc:  # counted: a report without a PUBACK
            self.failed.append(f"{type(exc).__name__}: {exc}")
            return False

    async def publish_round(self) -> None:
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(
            *(loop.run_in_executor(self.pool, self._publish, pub) for pub in self.publishers)
        )
        self.acked += sum(results)


class BatchRecorder:
    """Every distinct batch released on the batches topic (by ``batch_id``), through a
    persistent MQTT 5 session that survives broker restarts."""

    def __init__(self, broker: Broker, deployment: str) -> None:
        self.broker = broker
        self.topic = batches_topic(deployment)
        self.client_id = f"coco-test-recorder-{broker.port}"
        self.batches: dict[bytes, tuple[list[int], list[int]]] = {}
        self.subscribed = asyncio.Event()

    async def run(self) -> None:
        while True:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = 300
            try:
                async with aiomqtt.Client(
                    "127.0.0.1",
                    self.broker.port,
                    identifier=self.client_id,
                    protocol=aiomqtt.ProtocolVersion.V5,
                    clean_start=False,
                    properties=properties,
                    timeout=10,
                ) as client:
                    await client.subscribe(self.topic, qos=1)
                    self.subscribed.set()
                    async for message in client.messages:
                        assert isinstance(message.payload, bytes)
                        batch = message.payload[:-SIGNATURE_SIZE]
                        fingerprint, _round, batch_id, seeds, zs = decode_batch(batch)
                        assert fingerprint == SPEC.fingerprint_int
                        assert len(seeds) >= MIN_BATCH
                        self.batches[batch_id] = (seeds, zs)
            except aiomqtt.MqttError:
                await asyncio.sleep(0.2)

    @property
    def reports(self) -> int:
        return sum(len(seeds) for seeds, _ in self.batches.values())

    def offline(self) -> AggregateState:
        state = AggregateState(SPEC)
        seeds = [s for batch_seeds, _ in self.batches.values() for s in batch_seeds]
        zs = [z for _, batch_zs in self.batches.values() for z in batch_zs]
        state.add(np.array(seeds, dtype=np.uint32), np.array(zs, dtype=np.int64))
        return state


SIGNER_KEY = Ed25519PrivateKey.generate()


def shuffler_config(broker: Broker, deployment: str, reconnect: float = 0.1) -> ShufflerConfig:
    return ShufflerConfig(
        broker=broker.url,
        deployment=deployment,
        spec=SPEC,
        min_batch=MIN_BATCH,
        round_seconds=1,
        max_skew=0.5,
        late_seconds=60.0,
        signer=BatchSigner(SIGNER_KEY, deployment),
        flush_interval=0.2,
        drain_timeout=10.0,
        publish_timeout=5.0,
        reconnect_min=reconnect,
        reconnect_max=max(reconnect, 0.5),
        client_id=f"coco-shuffler-{deployment}",
        session_expiry=300,
    )


def aggregator_config(
    broker: Broker, deployment: str, checkpoint: Path, reconnect: float = 0.1
) -> AggregatorConfig:
    return AggregatorConfig(
        broker=broker.url,
        deployment=deployment,
        spec=SPEC,
        delta=1e-6,
        batch_public_key=BatchSigner(SIGNER_KEY, deployment).public_key_hex,
        min_batch=MIN_BATCH,
        round_seconds=1,
        http_port=None,
        checkpoint=checkpoint,
        checkpoint_interval=0.3,
        session_expiry=300,
        reconnect_min=reconnect,
        reconnect_max=max(reconnect, 0.5),
    )


@contextlib.contextmanager
def fleet_of(broker: Broker, deployment: str, workdir: Path) -> Iterator[Fleet]:
    fleet = Fleet(broker, deployment, workdir)
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.close()


async def stop_task(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, 15)


def shuffler_accounting(registry: CollectorRegistry) -> dict[str, Any]:
    return {
        "accepted": int(value(registry, "coco_shuffler_reports_accepted_total")),
        "received": int(value(registry, "coco_shuffler_reports_received_total")),
        "released": int(value(registry, "coco_shuffler_reports_released_total")),
        "rejected": {
            r: int(value(registry, "coco_shuffler_reports_rejected_total", reason=r))
            for r in REJECT_REASONS
        },
        "dropped": {
            r: int(value(registry, "coco_shuffler_dropped_total", reason=r)) for r in DROP_REASONS
        },
        "buffered": int(value(registry, "coco_shuffler_buffer_reports"))
        + int(value(registry, "coco_shuffler_outbox_reports")),
    }


async def all_delivered(shuffler_reg: CollectorRegistry, fleet: Fleet) -> None:
    """Until the shuffler has taken every report the broker acknowledged to a device. A stop
    before that leaves the rest queued in the shuffler's session for its next run (not lost,
    but not in this run's counts either), so the reconciliation below would be racy."""
    await wait_until(lambda: shuffler_accounting(shuffler_reg)["accepted"] >= fleet.acked)


def reconcile(
    shuffler_reg: CollectorRegistry,
    fleet: Fleet,
    aggregator: Aggregator,
    recorder: BatchRecorder,
    *,
    rounds: int,
) -> None:
    """Every PUBACKed report is aggregated, rejected by reason or dropped/buffered by reason,
    and the aggregator's sums are the offline sums of the batches the shuffler released."""
    assert not fleet.failed, fleet.failed[:3]
    assert fleet.acked == DEVICES * rounds
    acc = shuffler_accounting(shuffler_reg)
    # a report the broker re-sends (its PUBACK from the shuffler was lost in a restart) is a
    # duplicate of the same device and round: rejected by reason, never counted twice
    unexpected = {r: n for r, n in acc["rejected"].items() if n and r != "duplicate_in_round"}
    assert not unexpected
    assert acc["received"] == acc["accepted"] + acc["rejected"]["duplicate_in_round"]
    # every PUBACKed report reached the shuffler exactly once...
    assert acc["accepted"] == fleet.acked
    # ...and was released, or dropped / is still buffered, by reason
    assert acc["accepted"] == acc["released"] + sum(acc["dropped"].values()) + acc["buffered"]

    # every released batch counted exactly once, with the exact offline sums
    offline = recorder.offline()
    assert recorder.reports == offline.n == acc["released"]
    assert aggregator.state.n == offline.n
    assert aggregator.counters.reports == offline.n
    assert aggregator.counters.batches == len(recorder.batches)
    np.testing.assert_array_equal(aggregator.state.sum_u, offline.sum_u)
    np.testing.assert_array_equal(aggregator.state.sum_v, offline.sum_v)


def test_aggregator_restart_mid_stream(mosquitto: Broker, tmp_path: Path) -> None:
    dep = "resilience-agg"
    checkpoint = tmp_path / "aggregator.json"
    shuffler_reg = CollectorRegistry()

    async def scenario() -> tuple[Aggregator, Aggregator, BatchRecorder, Fleet]:
        recorder = BatchRecorder(mosquitto, dep)
        recorder_task = asyncio.create_task(recorder.run())
        shuffler = Shuffler(shuffler_config(mosquitto, dep), registry=shuffler_reg)
        first = Aggregator(aggregator_config(mosquitto, dep, checkpoint))
        second = Aggregator(aggregator_config(mosquitto, dep, checkpoint))
        try:
            await waiting.until(recorder.subscribed.is_set, stall=10, what="recorder.subscribed")
            with fleet_of(mosquitto, dep, tmp_path) as fleet:
                async with shuffler:
                    shuf_task = asyncio.create_task(shuffler.run())
                    async with first:
                        agg_task = asyncio.create_task(first.run())
                        await wait_until(
                            lambda: first.subscribed.is_set() and shuffler.connected.is_set()
                        )
                        for _ in range(3):
                            await fleet.publish_round()
                        await wait_until(
                            lambda: first.counters.batches >= 3,
                            progress=lambda: first.counters.batches,
                        )
                        await stop_task(agg_task)  # graceful: checkpoint, then PUBACKs
                    assert checkpoint.exists()
                    stopped_at = first.counters.batches
                    # batches released while the service is down wait in its session
                    for _ in range(3, 6):
                        await fleet.publish_round()
                    await wait_until(
                        lambda: recorder.reports >= fleet.acked - MIN_BATCH,
                        progress=lambda: recorder.reports,
                    )
                    async with second:
                        assert second.counters.batches == stopped_at  # resumed from disk
                        agg_task = asyncio.create_task(second.run())
                        for _ in range(6, 8):
                            await fleet.publish_round()
                        await all_delivered(shuffler_reg, fleet)
                        shuffler.stop()
                        await asyncio.wait_for(shuf_task, 20)
                        released = int(value(shuffler_reg, "coco_shuffler_reports_released_total"))
                        await wait_until(
                            lambda: second.state.n >= released, progress=lambda: second.state.n
                        )
                        await wait_until(
                            lambda: recorder.reports >= released, progress=lambda: recorder.reports
                        )
                        await asyncio.sleep(0.3)  # a duplicate would show up by now
                        await stop_task(agg_task)
        finally:
            await stop_task(recorder_task)
        return first, second, recorder, fleet

    first, second, recorder, fleet = run(scenario())
    reconcile(shuffler_reg, fleet, second, recorder, rounds=8)
    assert not any(shuffler_accounting(shuffler_reg)["rejected"].values())
    assert first.counters.batches < len(recorder.batches)  # the restart was mid-stream


def test_broker_restart_mid_stream(mosquitto_persistent: Broker, tmp_path: Path) -> None:
    broker = mosquitto_persistent
    dep = "resilience-broker"
    checkpoint = tmp_path / "aggregator.json"
    shuffler_reg = CollectorRegistry()

    async def scenario() -> tuple[Aggregator, BatchRecorder, Fleet]:
        recorder = BatchRecorder(broker, dep)
        recorder_task = asyncio.create_task(recorder.run())
        # The services come back later than the devices (paho retries after 1 s), so reports
        # and batches are published while they are away: only their persistent sessions,
        # kept across the restart by the broker's persistence, deliver those.
        shuffler = Shuffler(shuffler_config(broker, dep, reconnect=3.0), registry=shuffler_reg)
        aggregator = Aggregator(aggregator_config(broker, dep, checkpoint, reconnect=8.0))
        try:
            await waiting.until(recorder.subscribed.is_set, stall=10, what="recorder.subscribed")
            with fleet_of(broker, dep, tmp_path) as fleet:
                async with shuffler, aggregator:
                    shuf_task = asyncio.create_task(shuffler.run())
                    agg_task = asyncio.create_task(aggregator.run())
                    await wait_until(
                        lambda: aggregator.subscribed.is_set() and shuffler.connected.is_set()
                    )
                    for _ in range(3):
                        await fleet.publish_round()
                    await wait_until(
                        lambda: aggregator.counters.batches >= 3,
                        progress=lambda: aggregator.counters.batches,
                    )
                    # restart the broker while a round is being published
                    publishing = asyncio.create_task(fleet.publish_round())
                    await asyncio.sleep(0.05)
                    await asyncio.to_thread(broker.restart)
                    await asyncio.wait_for(publishing, 30)
                    for _ in range(4, 7):
                        await fleet.publish_round()
                    await wait_until(
                        lambda: aggregator.subscribed.is_set() and shuffler.connected.is_set()
                    )
                    await all_delivered(shuffler_reg, fleet)
                    shuffler.stop()
                    await asyncio.wait_for(shuf_task, 20)
                    released = int(value(shuffler_reg, "coco_shuffler_reports_released_total"))
                    await wait_until(
                        lambda: aggregator.state.n >= released, progress=lambda: aggregator.state.n
                    )
                    await wait_until(
                        lambda: recorder.reports >= released, progress=lambda: recorder.reports
                    )
                    await asyncio.sleep(0.3)
                    await stop_task(agg_task)
        finally:
            await stop_task(recorder_task)
        return aggregator, recorder, fleet

    aggregator, recorder, fleet = run(scenario())
    assert value(shuffler_reg, "coco_shuffler_reconnects_total") >= 1
    assert aggregator.connections >= 2
    reconcile(shuffler_reg, fleet, aggregator, recorder, rounds=7)
