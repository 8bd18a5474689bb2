"""The shuffling bridge against a real Mosquitto (no MQTT mocks).

Privacy properties under test: no released batch is smaller than ``min_batch``; nothing
that identifies a sender is in a batch; the permutation is uniform; every accepted report
is accounted for (released, buffered or counted as dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import aiomqtt
import pytest
from prometheus_client import CollectorRegistry
from scipy import stats

from broker.metrics import REJECT_REASONS
from broker.shuffler import Shuffler, ShufflerConfig
from edge.codec import decode_batch, encode_report
from edge.spec import MechanismSpec
from edge.topics import batches_topic, ingress_topic
from tests.conftest import Broker

pytestmark = pytest.mark.integration

DEP = "testdep"
SPEC = MechanismSpec(mechanism="coco", d=16, s=2, epsilon=1.0)
FP = SPEC.fingerprint_int
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    """Drive a coroutine from a sync test, with a hard timeout so nothing hangs."""

    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


def config(broker: Broker, **overrides: Any) -> ShufflerConfig:
    settings: dict[str, Any] = {
        "broker": broker.url,
        "deployment": DEP,
        "spec": SPEC,
        "min_batch": 5,
        "flush_interval": 0.2,
        "reconnect_min": 0.05,
        "reconnect_max": 0.5,
        "drain_timeout": 5.0,
        **overrides,
    }
    return ShufflerConfig(**settings)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    sample = registry.get_sample_value(name, labels)
    return 0.0 if sample is None else sample


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


class Batches:
    """A subscriber to the batches topic that records every message."""

    def __init__(self) -> None:
        self.messages: list[aiomqtt.Message] = []

    @property
    def decoded(self) -> list[tuple[int, int, bytes, list[int], list[int]]]:
        return [decode_batch(bytes(m.payload)) for m in self.messages]

    def count(self) -> int:
        return sum(len(batch[3]) for batch in self.decoded)


@contextlib.asynccontextmanager
async def batches(broker: Broker) -> AsyncIterator[Batches]:
    sink = Batches()
    async with aiomqtt.Client("127.0.0.1", broker.port) as client:
        await client.subscribe(batches_topic(DEP), qos=1)

        async def collect() -> None:
            async for message in client.messages:
                sink.messages.append(message)

        task = asyncio.create_task(collect())
        try:
            yield sink
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@contextlib.asynccontextmanager
async def running(cfg: ShufflerConfig, registry: CollectorRegistry) -> AsyncIterator[Shuffler]:
    async with Shuffler(cfg, registry=registry) as shuffler:
        task = asyncio.create_task(shuffler.run())
        async with asyncio.timeout(10):
            await shuffler.connected.wait()
        try:
            yield shuffler
        finally:
            shuffler.stop()
            async with asyncio.timeout(20):
                await task


async def publish(broker: Broker, reports: list[tuple[str, bytes]]) -> None:
    async with aiomqtt.Client("127.0.0.1", broker.port) as client:
        for device, payload in reports:
            await client.publish(ingress_topic(DEP, device), payload, qos=1)


def report(round_: int, seed: int, z: int = 1, fingerprint: int = FP) -> bytes:
    return encode_report(fingerprint, round_, seed, z)


def check_conservation(registry: CollectorRegistry, shuffler: Shuffler) -> None:
    received = value(registry, "coco_shuffler_reports_received_total")
    accepted = value(registry, "coco_shuffler_reports_accepted_total")
    rejected = sum(
        value(registry, "coco_shuffler_reports_rejected_total", reason=r) for r in REJECT_REASONS
    )
    assert received == accepted + rejected
    released = value(registry, "coco_shuffler_reports_released_total")
    buffered = value(registry, "coco_shuffler_buffer_reports")
    outbox = value(registry, "coco_shuffler_outbox_reports")
    dropped = sum(
        value(registry, "coco_shuffler_dropped_total", reason=r)
        for r in ("small_round", "at_shutdown", "carry_superseded", "unpublished_at_shutdown")
    )
    assert buffered == shuffler.buffered
    assert accepted == released + buffered + outbox + dropped


def test_rejects_by_reason_releases_min_batch_and_conserves(mosquitto: Broker) -> None:
    registry = CollectorRegistry()
    secret = "device-SECRET-id"
    good = [(f"{secret}-{i:03d}", report(7, 1000 + i, i % SPEC.t)) for i in range(23)]
    bad = [
        ("bad-1", b"\x01\x01short"),
        ("bad-2", b"\x09" + report(7, 1)[1:]),
        ("bad-3", report(7, 1, fingerprint=FP ^ 1)),
        ("bad-4", report(7, 1, z=SPEC.t)),
        (good[0][0], report(7, 99)),  # second report of a device in round 7
    ]

    async def scenario() -> None:
        async with batches(mosquitto) as sink, running(config(mosquitto), registry) as shuffler:
            await publish(mosquitto, good[:10] + bad + good[10:])
            await wait_until(lambda: sink.count() == 20)
            await wait_until(lambda: value(registry, "coco_shuffler_reports_received_total") == 28)
            await asyncio.sleep(0.5)  # two flush ticks: the 3 leftover stay buffered
            assert shuffler.buffered == 3
            check_conservation(registry, shuffler)
            for message in sink.messages:
                assert message.properties is None or not getattr(
                    message.properties, "UserProperty", None
                )
                assert secret.encode() not in bytes(message.payload)
                assert not message.retain
        check_conservation(registry, shuffler)
        released = sink.decoded
        assert all(len(seeds) >= 5 for _, _, _, seeds, _ in released)
        assert all(fp == FP and round_ == 7 for fp, round_, _, _, _ in released)
        assert len({batch_id for _, _, batch_id, _, _ in released}) == len(released)
        sent = Counter((1000 + i, i % SPEC.t) for i in range(23))
        got = Counter(pair for *_, seeds, zs in released for pair in zip(seeds, zs, strict=True))
        assert got <= sent
        assert sum(got.values()) == 20

    run(scenario())
    for reason, expected in [
        ("bad_length", 1),
        ("bad_version", 1),
        ("unknown_fingerprint", 1),
        ("z_out_of_range", 1),
        ("duplicate_in_round", 1),
    ]:
        assert value(registry, "coco_shuffler_reports_rejected_total", reason=reason) == expected
    assert value(registry, "coco_shuffler_reports_accepted_total") == 23
    assert value(registry, "coco_shuffler_batches_released_total") == 4
    assert value(registry, "coco_shuffler_reports_released_total") == 20
    assert value(registry, "coco_shuffler_batch_size_count") == 4
    assert value(registry, "coco_shuffler_release_latency_seconds_count") == 4
    assert value(registry, "coco_shuffler_dropped_total", reason="at_shutdown") == 3
    assert value(registry, "coco_shuffler_min_batch") == 5
    exposition = "\n".join(str(s) for metric in registry.collect() for s in metric.samples)
    assert "SECRET" not in exposition
    assert "device" not in exposition


def test_permutation_is_uniform(mosquitto: Broker) -> None:
    """Batches of 4 whose seeds are the arrival positions: all 24 orders equally likely."""
    registry = CollectorRegistry()
    n_batches = 480
    reports = [(f"d{i}", report(1, i % 4)) for i in range(4 * n_batches)]

    async def scenario() -> list[tuple[int, ...]]:
        async with (
            batches(mosquitto) as sink,
            running(config(mosquitto, min_batch=4, max_batch=8, flush_interval=60), registry),
        ):
            await publish(mosquitto, reports)
            await wait_until(lambda: len(sink.messages) == n_batches, timeout=20)
        return [tuple(seeds) for *_, seeds, _ in sink.decoded]

    orders = run(scenario(), timeout=45)
    assert all(sorted(order) == [0, 1, 2, 3] for order in orders)
    counts = Counter(orders)
    cells = list(itertools.permutations(range(4)))
    observed = [counts[cell] for cell in cells]
    expected = n_batches / len(cells)
    chi2 = sum((o - expected) ** 2 / expected for o in observed)
    assert stats.chi2.sf(chi2, len(cells) - 1) > 1e-6, observed
    first = Counter(order.index(0) for order in orders)
    chi2_first = sum((first[k] - n_batches / 4) ** 2 / (n_batches / 4) for k in range(4))
    assert stats.chi2.sf(chi2_first, 3) > 1e-6, first
    assert counts[(0, 1, 2, 3)] < n_batches / 2  # not the arrival order


@pytest.mark.parametrize("policy", ["carry", "drop"])
def test_round_policy(mosquitto: Broker, policy: str) -> None:
    registry = CollectorRegistry()
    round1 = [(d, report(1, 10 + k)) for k, d in enumerate(["a", "b", "c"])]
    round2 = [(d, report(2, 20 + k)) for k, d in enumerate(["a", "d", "e"])]

    async def scenario() -> Shuffler:
        async with (
            batches(mosquitto) as sink,
            running(config(mosquitto, round_policy=policy), registry) as shuffler,
        ):
            await publish(mosquitto, round1 + round2)
            await wait_until(lambda: value(registry, "coco_shuffler_reports_accepted_total") == 6)
            if policy == "carry":
                await wait_until(lambda: len(sink.messages) == 1)
                [(_, round_, _, seeds, _)] = sink.decoded
                assert round_ == 2  # a carried batch carries the newest round
                # device a's round-1 report is superseded: one report per device per batch
                assert sorted(seeds) == [11, 12, 20, 21, 22]
            else:
                await wait_until(
                    lambda: (
                        value(registry, "coco_shuffler_dropped_total", reason="small_round") == 3
                    )
                )
                assert shuffler.buffered == 3
            check_conservation(registry, shuffler)
        await asyncio.sleep(0.2)
        assert all(len(b[3]) >= 5 for b in sink.decoded)
        check_conservation(registry, shuffler)
        return shuffler

    run(scenario())
    if policy == "carry":
        assert value(registry, "coco_shuffler_dropped_total", reason="carry_superseded") == 1
        assert value(registry, "coco_shuffler_reports_released_total") == 5
    else:
        assert value(registry, "coco_shuffler_dropped_total", reason="at_shutdown") == 3
        assert value(registry, "coco_shuffler_reports_released_total") == 0


def test_graceful_shutdown_releases_full_buffers_only(
    mosquitto: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    registry = CollectorRegistry()
    cfg = config(mosquitto, min_batch=3, release_size=10, max_batch=10, flush_interval=60)
    reports = [(f"x{i}", report(1, i)) for i in range(7)] + [
        (f"y{i}", report(2, 100 + i)) for i in range(2)
    ]

    async def scenario() -> Batches:
        async with batches(mosquitto) as sink:
            async with running(cfg, registry) as shuffler:
                await publish(mosquitto, reports)
                await wait_until(lambda: shuffler.buffered == 9)
                assert not sink.messages
            await wait_until(lambda: len(sink.messages) == 1)
            check_conservation(registry, shuffler)
            return sink

    sink = run(scenario())
    [(_, round_, _, seeds, _)] = sink.decoded
    assert round_ == 1
    assert sorted(seeds) == list(range(7))
    assert value(registry, "coco_shuffler_dropped_total", reason="at_shutdown") == 2
    assert value(registry, "coco_shuffler_buffer_reports") == 0
    # A clean stop disconnects each client once (gmqtt warns about a second DISCONNECT).
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_cancellation_drains_like_stop(mosquitto: Broker) -> None:
    registry = CollectorRegistry()
    cfg = config(mosquitto, min_batch=3, flush_interval=60, release_size=10, max_batch=10)

    async def scenario() -> Batches:
        async with batches(mosquitto) as sink:
            async with Shuffler(cfg, registry=registry) as shuffler:
                task = asyncio.create_task(shuffler.run())
                await asyncio.wait_for(shuffler.connected.wait(), 10)
                await publish(mosquitto, [(f"z{i}", report(3, i)) for i in range(4)])
                await wait_until(lambda: shuffler.buffered == 4)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            await wait_until(lambda: len(sink.messages) == 1)
            return sink

    sink = run(scenario())
    assert sorted(sink.decoded[0][3]) == [0, 1, 2, 3]


def test_reconnects_after_broker_restart(mosquitto: Broker) -> None:
    registry = CollectorRegistry()
    cfg = config(mosquitto, min_batch=3)

    async def scenario() -> int:
        async with running(cfg, registry) as shuffler:
            async with batches(mosquitto) as sink:
                await publish(mosquitto, [(f"p{i}", report(1, i)) for i in range(4)])
                await wait_until(lambda: len(sink.messages) == 1)
            await asyncio.to_thread(mosquitto.restart)
            await wait_until(
                lambda: (
                    value(registry, "coco_shuffler_reconnects_total") >= 1
                    and shuffler.connected.is_set()
                )
            )
            assert shuffler.buffered == 1  # kept in memory across the reconnect
            async with batches(mosquitto) as sink:
                await publish(mosquitto, [(f"q{i}", report(1, 10 + i)) for i in range(5)])
                await wait_until(lambda: len(sink.messages) == 2)
                assert all(len(b[3]) >= 3 for b in sink.decoded)
            check_conservation(registry, shuffler)
            return shuffler.buffered

    assert run(scenario(), timeout=40) == 0
    assert value(registry, "coco_shuffler_reports_released_total") == 9
    assert value(registry, "coco_shuffler_batches_released_total") == 3


def test_config_refuses_unsafe_sizes(mosquitto: Broker) -> None:
    with pytest.raises(ValueError, match="min_batch"):
        config(mosquitto, min_batch=1)
    with pytest.raises(ValueError, match="max_batch"):
        config(mosquitto, min_batch=5, max_batch=9)
    with pytest.raises(ValueError, match="release_size"):
        config(mosquitto, min_batch=5, release_size=4)
    assert math.isclose(config(mosquitto).flush_interval, 0.2)


@pytest.mark.parametrize("ingest_client", ["gmqtt", "aiomqtt"])
def test_ingest_clients_reject_alike_and_drain(mosquitto: Broker, ingest_client: str) -> None:
    """Both ingest paths: same rejection reasons (retained included), batches >= min_batch,
    and everything received before stop is pooled (the unsubscribe barrier)."""
    registry = CollectorRegistry()
    cfg = config(mosquitto, ingest_client=ingest_client, flush_interval=60.0)
    good = [(f"g{i}", report(3, i)) for i in range(12)]

    async def scenario() -> list[tuple[int, int, bytes, list[int], list[int]]]:
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            # Retained before the shuffler subscribes: delivered with the retain flag.
            await client.publish(ingress_topic(DEP, "r1"), report(3, 500), qos=1, retain=True)
        async with batches(mosquitto) as sink:
            async with running(cfg, registry) as shuffler:
                await publish(mosquitto, [*good, ("b1", b"\x01\x01short"), ("g0", report(3, 99))])
                await wait_until(
                    lambda: value(registry, "coco_shuffler_reports_accepted_total") == 12
                )
                await wait_until(lambda: sink.count() == 10)
                await wait_until(
                    lambda: (
                        value(
                            registry,
                            "coco_shuffler_reports_rejected_total",
                            reason="duplicate_in_round",
                        )
                        == 1
                    )
                )
                assert shuffler.buffered == 2
            await asyncio.sleep(0.2)
            check_conservation(registry, shuffler)
            async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
                await client.publish(ingress_topic(DEP, "r1"), b"", qos=1, retain=True)
            return sink.decoded

    released = run(scenario())
    assert all(len(seeds) >= 5 for *_, seeds, _ in released)
    assert sum(len(seeds) for *_, seeds, _ in released) == 10
    assert value(registry, "coco_shuffler_reports_rejected_total", reason="retained") == 1
    assert value(registry, "coco_shuffler_reports_rejected_total", reason="bad_length") == 1
    assert value(registry, "coco_shuffler_reports_rejected_total", reason="duplicate_in_round") == 1
    assert value(registry, "coco_shuffler_dropped_total", reason="at_shutdown") == 2
    assert value(registry, "coco_shuffler_connected") == 0


def test_aiomqtt_ingest_reconnects_after_broker_restart(mosquitto: Broker) -> None:
    registry = CollectorRegistry()
    cfg = config(mosquitto, min_batch=3, ingest_client="aiomqtt")

    async def scenario() -> None:
        async with running(cfg, registry) as shuffler:
            await asyncio.to_thread(mosquitto.restart)
            await wait_until(
                lambda: (
                    value(registry, "coco_shuffler_reconnects_total") >= 1
                    and shuffler.connected.is_set()
                )
            )
            async with batches(mosquitto) as sink:
                await publish(mosquitto, [(f"q{i}", report(1, i)) for i in range(3)])
                await wait_until(lambda: len(sink.messages) == 1)
            check_conservation(registry, shuffler)

    run(scenario(), timeout=40)


def test_gmqtt_mqtt311_and_refused_ingest_client(mosquitto: Broker) -> None:
    registry = CollectorRegistry()
    cfg = config(mosquitto, min_batch=3, mqtt_version="3.1.1", client_id="coco-shuffler-311")

    async def scenario() -> None:
        async with batches(mosquitto) as sink, running(cfg, registry):
            await publish(mosquitto, [(f"v{i}", report(2, i)) for i in range(3)])
            await wait_until(lambda: len(sink.messages) == 1)

    run(scenario())
    with pytest.raises(ValueError, match="ingest_client"):
        config(mosquitto, ingest_client="paho")
