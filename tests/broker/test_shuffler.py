"""The shuffling bridge against a real Mosquitto (no MQTT mocks).

Privacy properties under test: no released batch is smaller than ``min_batch``; nothing
that identifies a sender is in a batch, a log line or a metric; the permutation is uniform;
batches are signed; every accepted report is accounted for (released, buffered or counted
as dropped). Durability: the state directory survives a restart (pools, duplicate tokens,
unacknowledged batches), the persistent session queues reports while the shuffler is
away, a second shuffler cannot run on the same state, and one that loses its session to
another client stops instead of fighting.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import aiomqtt
import pytest
from prometheus_client import CollectorRegistry
from scipy import stats

from broker.service.metrics import DROP_REASONS, REJECT_REASONS
from broker.service.shuffler import Shuffler, ShufflerConfig
from broker.store.wal import StoreError
from edge.batch_auth import BatchAuthError, BatchSigner, BatchVerifier
from edge.codec import decode_batch, encode_report
from edge.rounds import current_round
from edge.spec import MechanismSpec
from edge.topics import batches_topic, ingress_topic
from tests import asyncutil, waiting
from tests.conftest import Broker

pytestmark = pytest.mark.integration

DEP = "testdep"
SPEC = MechanismSpec(mechanism="coco", d=16, s=2, epsilon=1.0)
FP = SPEC.fingerprint_int
L = 2  # round_seconds: a report is accepted for at least max_skew after its round ends
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 40.0) -> T:
    """Drive a coroutine from a sync test, with a guard so nothing hangs (tests/asyncutil.py:
    the waits inside fail first, when their progress stops)."""
    return asyncutil.run(coro, timeout)


def config(broker: Broker, **overrides: Any) -> ShufflerConfig:
    settings: dict[str, Any] = {
        "broker": broker.url,
        "deployment": DEP,
        "spec": SPEC,
        "min_batch": 5,
        "round_seconds": L,
        "max_skew": 1.0,
        "flush_interval": 0.1,
        "reconnect_min": 0.05,
        "reconnect_max": 0.5,
        "drain_timeout": 5.0,
        "create_signing_key": True,
        "lease_settle": 0.3,  # a shuffler with a state directory holds the deployment's lease
        **overrides,
    }
    return ShufflerConfig(**settings)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    sample = registry.get_sample_value(name, labels)
    return 0.0 if sample is None else sample


wait_until = waiting.Waits(15.0).until
"""tests/waiting.py's wait: fails when ``progress`` stood still for 15 s (or the window given)."""


async def round_start() -> int:
    """Wait for a fresh round to begin (so a test's reports all fit in it); its number."""
    now = time.time()
    await asyncio.sleep((current_round(L, now) + 1) * L - now + 0.01)
    return current_round(L)


class Batches:
    """A subscriber to the batches topic that records every message."""

    def __init__(self) -> None:
        self.messages: list[aiomqtt.Message] = []

    def opened(self, verifier: BatchVerifier) -> list[tuple[int, int, bytes, list[int], list[int]]]:
        return [decode_batch(bytes(verifier.open(bytes(m.payload)))) for m in self.messages]

    def count(self) -> int:
        return sum(int.from_bytes(bytes(m.payload)[26:30], "big") for m in self.messages)


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
        await waiting.until(shuffler.connected.is_set, stall=10, what="the shuffler connected")
        try:
            yield shuffler
        finally:
            shuffler.stop()
            async with asyncio.timeout(waiting.scaled(20)):
                await task


async def publish(broker: Broker, reports: list[tuple[str, bytes]], **kw: Any) -> None:
    """Publish each payload on the device's ingress topic (built by hand: a hostile device
    may use names the protocol forbids)."""
    prefix = ingress_topic(DEP, "x")[:-1]
    async with aiomqtt.Client("127.0.0.1", broker.port) as client:
        for device, payload in reports:
            await client.publish(prefix + device, payload, qos=1, **kw)


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
    dropped = sum(value(registry, "coco_shuffler_dropped_total", reason=r) for r in DROP_REASONS)
    assert buffered == shuffler.buffered
    assert accepted == released + buffered + outbox + dropped


def test_rejects_by_reason_releases_whole_signed_rounds_and_conserves(
    mosquitto: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    registry = CollectorRegistry()
    secret = "device-SECRET-id"
    signer = BatchSigner.generate(DEP)
    verifier = BatchVerifier(signer.public_key_hex, DEP)

    async def scenario() -> None:
        async with batches(mosquitto) as sink, running(config(mosquitto, signer=signer), registry):
            r = await round_start()
            good = [(f"{secret}-{i:03d}", report(r, 1000 + i, i % SPEC.t)) for i in range(23)]
            bad = [
                ("bad-1", b"\x01\x01short"),
                ("bad-2", b"\x09" + report(r, 1)[1:]),
                ("bad-3", report(r, 1, fingerprint=FP ^ 1)),
                ("bad-4", report(r, 1, z=SPEC.t)),
                ("bad-5", report(r - 400, 1)),  # ended 800 s ago: past late_seconds
                ("bad-6", report(r + 5, 1)),
                ("bad-7", report(0xFFFFFFFF, 1)),
                ("x" * 65, report(r, 1)),
                (good[0][0], report(r, 99)),  # second report of a device in the round
            ]
            await publish(mosquitto, good[:10] + bad + good[10:])
            await publish(mosquitto, [("bad-8", report(r, 1))], retain=True)
            await wait_until(lambda: sink.count() == 23, progress=sink.count)
            assert len(sink.messages) == 1  # the whole round, as one batch
            for message in sink.messages:
                assert message.properties is None or not getattr(
                    message.properties, "UserProperty", None
                )
                assert secret.encode() not in bytes(message.payload)
                assert not message.retain
            [(fp, round_, _, seeds, zs)] = sink.opened(verifier)
            assert (fp, round_) == (FP, r)
            assert Counter(zip(seeds, zs, strict=True)) == Counter(
                (1000 + i, i % SPEC.t) for i in range(23)
            )
            forged = bytearray(bytes(sink.messages[0].payload))
            forged[40] ^= 1
            with pytest.raises(BatchAuthError):
                verifier.open(bytes(forged))

    run(scenario())
    for reason, expected in [
        ("bad_length", 1),
        ("bad_version", 1),
        ("unknown_fingerprint", 1),
        ("z_out_of_range", 1),
        ("round_too_old", 1),
        ("round_in_future", 2),
        ("bad_device_id", 1),
        ("duplicate_in_round", 1),
        ("retained", 1),
    ]:
        assert value(registry, "coco_shuffler_reports_rejected_total", reason=reason) == expected
    assert value(registry, "coco_shuffler_reports_accepted_total") == 23
    assert value(registry, "coco_shuffler_batches_released_total") == 1
    assert value(registry, "coco_shuffler_reports_released_total") == 23
    assert value(registry, "coco_shuffler_release_latency_seconds_count") == 1
    exposition = "\n".join(str(s) for metric in registry.collect() for s in metric.samples)
    assert "SECRET" not in exposition
    assert "device-" not in exposition
    assert not [r for r in caplog.records if "SECRET" in r.getMessage()]


def test_permutation_is_uniform(mosquitto: Broker) -> None:
    """Batches of 4 whose seeds are the arrival positions: all 24 orders equally likely.

    ``release_size`` 4 releases each pool of 4 at once (the latency cap), so one round
    gives many batches."""
    n_batches = 480
    hour = 3600  # round_seconds: publishing all reports in one round, even on a slow machine

    async def scenario() -> list[tuple[int, ...]] | None:
        """The batches' seeds; ``None`` if the round ended while the reports were on their
        way (some then arrive too late for it, and the groups of 4 no longer line up)."""
        registry = CollectorRegistry()
        cfg = config(mosquitto, min_batch=4, max_batch=8, release_size=4, round_seconds=hour)
        async with batches(mosquitto) as sink, running(cfg, registry) as shuffler:
            r = current_round(hour)
            await publish(mosquitto, [(f"d{i}", report(r, i % 4)) for i in range(4 * n_batches)])

            def received() -> float:
                return value(registry, "coco_shuffler_reports_received_total")

            await wait_until(lambda: received() == 4 * n_batches, 20, progress=received)
            if value(registry, "coco_shuffler_reports_accepted_total") < 4 * n_batches:
                return None
            await wait_until(
                lambda: len(sink.messages) == n_batches,
                20,
                progress=lambda: len(sink.messages),
                what=f"{n_batches} batches",
            )
            verifier = BatchVerifier(shuffler.public_key_hex, DEP)
            return [tuple(seeds) for *_, seeds, _ in sink.opened(verifier)]

    orders = run(scenario(), timeout=60)
    if orders is None:  # the hour turned while it ran: once more, in a round just begun
        orders = run(scenario(), timeout=60)
    assert orders is not None
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


@pytest.mark.parametrize("policy", ["carry", "drop"])
def test_round_policy(mosquitto: Broker, policy: str) -> None:
    registry = CollectorRegistry()

    async def scenario() -> None:
        cfg = config(mosquitto, round_policy=policy)
        async with batches(mosquitto) as sink, running(cfg, registry) as shuffler:
            r = await round_start()
            await publish(mosquitto, [(d, report(r, 10 + k)) for k, d in enumerate("abc")])
            r2 = await round_start()
            await publish(mosquitto, [(d, report(r2, 20 + k)) for k, d in enumerate("ade")])
            await wait_until(
                lambda: value(registry, "coco_shuffler_reports_accepted_total") == 6,
                progress=lambda: value(registry, "coco_shuffler_reports_accepted_total"),
            )
            if policy == "carry":
                await wait_until(
                    lambda: len(sink.messages) == 1, progress=lambda: len(sink.messages)
                )
                [(_, round_, _, seeds, _)] = sink.opened(
                    BatchVerifier(shuffler.public_key_hex, DEP)
                )
                assert round_ == r2  # a carried batch bears the round it was carried into
                # device a's round-r report is superseded: one report per device per batch
                assert sorted(seeds) == [11, 12, 20, 21, 22]
            else:
                await wait_until(
                    lambda: (
                        value(registry, "coco_shuffler_dropped_total", reason="small_round") == 6
                    )
                )
                assert not sink.messages
            check_conservation(registry, shuffler)

    run(scenario())
    if policy == "carry":
        assert value(registry, "coco_shuffler_dropped_total", reason="carry_superseded") == 1
        assert value(registry, "coco_shuffler_reports_released_total") == 5


def test_memory_only_stop_releases_full_pools_and_counts_the_rest(
    mosquitto: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    registry = CollectorRegistry()
    cfg = config(mosquitto, min_batch=3, round_seconds=60)

    async def scenario() -> Batches:
        async with batches(mosquitto) as sink:
            async with running(cfg, registry) as shuffler:
                r = current_round(60)
                await publish(mosquitto, [(f"x{i}", report(r, i)) for i in range(7)])
                await publish(mosquitto, [(f"y{i}", report(r + 1, 100 + i)) for i in range(2)])
                await wait_until(
                    lambda: (
                        shuffler.buffered
                        + value(
                            registry,
                            "coco_shuffler_reports_rejected_total",
                            reason="round_in_future",
                        )
                        == 9
                    )
                )
                assert not sink.messages
            await wait_until(lambda: len(sink.messages) == 1, progress=lambda: len(sink.messages))
            check_conservation(registry, shuffler)
            return sink

    sink = run(scenario())
    assert sink.count() == 7
    assert value(registry, "coco_shuffler_buffer_reports") == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == []  # a clean stop disconnects each client once
    assert any("released: 7 reports" in r.getMessage() for r in caplog.records)


def test_restart_keeps_pools_and_duplicate_state(mosquitto: Broker, tmp_path: Path) -> None:
    """A stop keeps every accepted report in the state directory; after a restart the pool
    is released whole, and a replay of a report accepted before the restart is a
    duplicate."""
    registry = CollectorRegistry()
    # the round stays open 5 s after its end: two starts and a stop fit in it on a loaded
    # machine too
    cfg = config(mosquitto, state_dir=tmp_path / "state", round_seconds=4, max_skew=5.0)

    async def scenario() -> None:
        async with batches(mosquitto) as sink:
            now = time.time()
            await asyncio.sleep((current_round(4, now) + 1) * 4 - now + 0.01)
            r = current_round(4)
            first = [(f"k{i}", report(r, i)) for i in range(4)]
            async with running(cfg, registry) as shuffler:
                await publish(mosquitto, first)
                await wait_until(lambda: shuffler.buffered == 4, progress=lambda: shuffler.buffered)
            async with running(cfg, CollectorRegistry()) as again:
                assert again.buffered == 4
                await publish(mosquitto, [*first[:2], ("k9", report(r, 9))])  # 2 replays
                await wait_until(lambda: again.buffered == 5, progress=lambda: again.buffered)
                await wait_until(
                    lambda: len(sink.messages) == 1, progress=lambda: len(sink.messages)
                )
                verifier = BatchVerifier(again.public_key_hex, DEP)
                assert sorted(sink.opened(verifier)[0][3]) == [0, 1, 2, 3, 9]
            assert (
                tmp_path / "state" / "signing.pub"
            ).read_text().strip() == verifier.public_key_hex

    run(scenario())
    assert value(registry, "coco_shuffler_dropped_total", reason="at_shutdown") == 0


def test_reports_published_while_down_are_queued_by_the_session(
    mosquitto: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="broker.shuffler")
    registry = CollectorRegistry()
    cfg = config(mosquitto, state_dir=tmp_path / "state", round_seconds=60)

    async def scenario() -> None:
        async with running(cfg, registry):
            pass  # the first run creates the persistent session
        # a healthy first start: said at INFO, no warning to learn to ignore
        new = [r for r in caplog.records if "session" in r.getMessage()]
        assert [(r.levelno, r.getMessage()) for r in new] == [
            (logging.INFO, "a new session on the broker (first start)")
        ]
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        r = current_round(60)
        await publish(mosquitto, [(f"q{i}", report(r, i)) for i in range(6)])
        again_registry = CollectorRegistry()
        async with running(cfg, again_registry) as again:
            await wait_until(lambda: again.buffered == 6, progress=lambda: again.buffered)
        # the broker kept the session: its CONNACK said so
        assert value(again_registry, "coco_shuffler_sessions_new_total") == 0

    run(scenario())
    assert value(registry, "coco_shuffler_sessions_new_total") == 1  # the first run's
    assert not [r for r in caplog.records if "held no session" in r.getMessage()]


def test_a_new_session_for_a_state_directory_that_had_one_is_a_warning(
    mosquitto: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker (no persistence here) restarted while the shuffler was stopped: the next
    start on the same state directory finds no session, a loss the state directory tells
    from a first start."""
    caplog.set_level(logging.INFO, logger="broker.shuffler")
    cfg = config(mosquitto, state_dir=tmp_path / "state", round_seconds=60)
    registry = CollectorRegistry()

    async def scenario() -> None:
        async with running(cfg, CollectorRegistry()):
            pass
        await asyncio.to_thread(mosquitto.restart)
        caplog.clear()
        async with running(cfg, registry):
            pass

    run(scenario())
    assert value(registry, "coco_shuffler_sessions_new_total") == 1
    lost = [r for r in caplog.records if "held no session" in r.getMessage()]
    assert [r.levelno for r in lost] == [logging.WARNING], lost
    assert "it lost the session" in lost[0].getMessage()
    assert not [r for r in caplog.records if "first start" in r.getMessage()]


def test_second_shuffler_on_the_same_state_refuses(mosquitto: Broker, tmp_path: Path) -> None:
    cfg = config(mosquitto, state_dir=tmp_path / "state")

    async def scenario() -> None:
        async with running(cfg, CollectorRegistry()):
            with pytest.raises(StoreError, match="another shuffler"):
                async with Shuffler(cfg, registry=CollectorRegistry()):
                    pass

    run(scenario())


def test_two_shufflers_with_one_client_id_do_not_fight(mosquitto: Broker, tmp_path: Path) -> None:
    """Two shufflers of one account (on two hosts: two state directories) take the session
    over from each other; within a few takeovers one of them stops with a clear error and
    the other keeps the session and keeps running. (Of one deployment, the second would not
    start: the deployment's lease refuses it, tests/broker/test_unsharded_lease.py; two
    deployments here, so that the session, which knows no deployment, is what they fight
    over.)"""
    configs = [
        config(
            mosquitto,
            client_id="coco-shuffler-x",
            deployment=f"{DEP}-{name}",
            state_dir=tmp_path / name,
        )
        for name in ("a", "b")
    ]

    async def scenario() -> list[BaseException | None]:
        async with contextlib.AsyncExitStack() as stack:
            shufflers = [
                await stack.enter_async_context(Shuffler(cfg, registry=CollectorRegistry()))
                for cfg in configs
            ]
            tasks = [asyncio.create_task(s.run()) for s in shufflers]
            done, _ = await asyncio.wait(tasks, timeout=20, return_when=asyncio.FIRST_COMPLETED)
            assert len(done) == 1
            await asyncio.sleep(3)  # the survivor holds the session undisturbed
            (survivor,) = [s for s, t in zip(shufflers, tasks, strict=True) if not t.done()]
            assert survivor.connected.is_set()
            survivor.stop()
            await asyncio.wait(tasks, timeout=20)
            return [t.exception() for t in tasks]

    errors = run(scenario())
    assert sorted(type(e).__name__ for e in errors) == ["NoneType", "SessionTakenOverError"]


def test_oversized_messages_never_reach_the_shuffler(mosquitto: Broker) -> None:
    """The ingest connection's Maximum Packet Size: a 1 MB message on a device topic is
    discarded by the broker for the shuffler; honest reports around it all arrive."""
    registry = CollectorRegistry()

    async def scenario() -> None:
        cfg = config(mosquitto, round_seconds=60)
        async with running(cfg, registry) as shuffler:
            r = current_round(60)
            await publish(mosquitto, [(f"h{i}", report(r, i)) for i in range(5)])
            await publish(mosquitto, [("attacker", b"\x01" * 1_000_000)] * 3)
            await publish(mosquitto, [(f"h{i + 5}", report(r, i + 5)) for i in range(5)])
            await wait_until(lambda: shuffler.buffered == 10, progress=lambda: shuffler.buffered)

    run(scenario())
    assert value(registry, "coco_shuffler_reports_received_total") == 10


def test_qos_0_reports_are_accepted_too(mosquitto: Broker) -> None:
    registry = CollectorRegistry()

    async def scenario() -> None:
        async with running(config(mosquitto, round_seconds=60), registry) as shuffler:
            r = current_round(60)
            prefix = ingress_topic(DEP, "x")[:-1]
            async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
                for i in range(5):
                    await client.publish(f"{prefix}q0-{i}", report(r, i), qos=0)
                await client.publish(f"{prefix}q0-bad", b"\x01\x01short", qos=0)
            await wait_until(lambda: shuffler.buffered == 5, progress=lambda: shuffler.buffered)
            await wait_until(
                lambda: (
                    value(registry, "coco_shuffler_reports_rejected_total", reason="bad_length")
                    == 1
                )
            )

    run(scenario())


def test_reconnects_after_broker_restart(
    mosquitto: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """The test broker has no persistence: its restart loses the shuffler's session, which
    the shuffler counts and warns of (what was published meanwhile is lost uncounted)."""
    caplog.set_level(logging.INFO, logger="broker.shuffler")
    registry = CollectorRegistry()
    cfg = config(mosquitto, min_batch=3, round_seconds=60)

    async def scenario() -> None:
        async with running(cfg, registry) as shuffler:
            r = current_round(60)
            await publish(mosquitto, [(f"p{i}", report(r, i)) for i in range(4)])
            await wait_until(lambda: shuffler.buffered == 4, progress=lambda: shuffler.buffered)
            await asyncio.to_thread(mosquitto.restart)
            await wait_until(
                lambda: (
                    value(registry, "coco_shuffler_reconnects_total") >= 1
                    and shuffler.connected.is_set()
                )
            )
            assert shuffler.buffered == 4  # kept across the reconnect
            assert value(registry, "coco_shuffler_sessions_new_total") == 2
            lost = [r for r in caplog.records if "held no session" in r.getMessage()]
            assert [r.levelno for r in lost] == [logging.WARNING], lost
            assert "it lost the session" in lost[0].getMessage()
            await publish(mosquitto, [(f"q{i}", report(r, 10 + i)) for i in range(5)])
            await wait_until(lambda: shuffler.buffered == 9, progress=lambda: shuffler.buffered)
            check_conservation(registry, shuffler)

    run(scenario())


def test_mqtt311_ingest(mosquitto: Broker) -> None:
    registry = CollectorRegistry()
    cfg = config(mosquitto, min_batch=3, mqtt_version="3.1.1", round_seconds=60)

    async def scenario() -> None:
        async with running(cfg, registry) as shuffler:
            r = current_round(60)
            await publish(mosquitto, [(f"v{i}", report(r, i)) for i in range(3)])
            await wait_until(lambda: shuffler.buffered == 3, progress=lambda: shuffler.buffered)

    run(scenario())


def test_config_refuses_unsafe_sizes(mosquitto: Broker) -> None:
    with pytest.raises(ValueError, match="min_batch"):
        config(mosquitto, min_batch=1)
    with pytest.raises(ValueError, match="max_batch"):
        config(mosquitto, min_batch=5, max_batch=9)
    with pytest.raises(ValueError, match="release_size"):
        config(mosquitto, min_batch=5, release_size=4)
    with pytest.raises(ValueError, match="round_seconds"):
        config(mosquitto, round_seconds=0)
    assert config(mosquitto).ingest_client_id == f"coco-shuffler-{DEP}"
    assert config(mosquitto, username="svc").ingest_client_id == "svc"


def test_qos_0_reports_are_handled_like_qos_1(mosquitto: Broker) -> None:
    """A report published at QoS 0 arrives at QoS 0 (the broker downgrades to the
    publisher's QoS): it is validated, counted and pooled like any other, not ignored."""
    registry = CollectorRegistry()

    async def scenario() -> None:
        async with running(config(mosquitto, min_batch=2, round_seconds=60), registry) as shuffler:
            r = current_round(60)
            prefix = ingress_topic(DEP, "x")[:-1]
            async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
                await client.publish(prefix + "a", report(r, 1), qos=0)
                await client.publish(prefix + "a", report(r, 2), qos=0)  # duplicate
                await client.publish(prefix + "b", report(r, 3)[:5], qos=0)  # bad length
                await client.publish(prefix + "c", report(r, 4), qos=1)  # barrier
            await wait_until(
                lambda: value(registry, "coco_shuffler_reports_received_total") == 4,
                progress=lambda: value(registry, "coco_shuffler_reports_received_total"),
            )
            assert value(registry, "coco_shuffler_reports_accepted_total") == 2
            for reason in ("duplicate_in_round", "bad_length"):
                assert value(registry, "coco_shuffler_reports_rejected_total", reason=reason) == 1
            check_conservation(registry, shuffler)

    run(scenario())


def test_a_stop_mid_stream_acknowledges_only_what_it_handled(
    mosquitto: Broker, tmp_path: Path
) -> None:
    """Stopped while reports stream in, the shuffler leaves every report it did not handle
    unacknowledged, and acknowledges every one it handled, so the next run gets exactly the
    rest: no report is lost, and none comes back as a duplicate (``duplicate_in_round``
    counts devices, not the shuffler's own restarts)."""
    first, second = CollectorRegistry(), CollectorRegistry()
    cfg = config(mosquitto, state_dir=tmp_path / "state", round_seconds=60, min_batch=5)
    total = 3000

    def accepted(registry: CollectorRegistry) -> float:
        return value(registry, "coco_shuffler_reports_accepted_total")

    first_stopped = asyncio.Event()

    async def stream(r: int) -> None:
        """Half the reports, then (once the first run has stopped) the other half: the
        first run stops while the stream is under way, whatever the machine's load (a
        shuffler that took every report before its stop came would test nothing)."""
        prefix = ingress_topic(DEP, "x")[:-1]
        async with aiomqtt.Client("127.0.0.1", mosquitto.port, max_inflight_messages=500) as c:
            for start in range(0, total, 500):
                if start == total // 2:
                    await first_stopped.wait()
                await asyncio.gather(
                    *(
                        c.publish(f"{prefix}s{i}", report(r, i), qos=1)
                        for i in range(start, start + 500)
                    )
                )

    async def scenario() -> None:
        async with running(cfg, CollectorRegistry()):
            pass  # the persistent session exists from here on
        r = current_round(60)
        publisher = asyncio.create_task(stream(r))
        async with running(cfg, first):
            await wait_until(lambda: accepted(first) >= total // 5)
        first_stopped.set()
        assert accepted(first) < total  # stopped mid-stream
        async with running(cfg, second):
            await publisher
            await wait_until(lambda: accepted(first) + accepted(second) >= total)
            await asyncio.sleep(0.5)  # anything redelivered twice would be counted by now
        assert accepted(first) + accepted(second) == total
        rejected = value(
            second, "coco_shuffler_reports_rejected_total", reason="duplicate_in_round"
        )
        assert rejected == 0

    run(scenario(), 60)


def test_a_failed_log_write_acknowledges_nothing_and_the_next_run_gets_it_all(
    mosquitto: Broker, tmp_path: Path
) -> None:
    """The log's disk fails under a running shuffler (a real ``write(2)`` error: the log's
    descriptor now refers to a read-only file). The shuffler stops with the error and
    acknowledges none of the reports whose records were not written, so the broker
    redelivers every one of them to the next run, which counts each once."""
    cfg = config(mosquitto, state_dir=tmp_path / "state", round_seconds=60, min_batch=5)
    first, second = CollectorRegistry(), CollectorRegistry()

    def accepted(registry: CollectorRegistry) -> float:
        return value(registry, "coco_shuffler_reports_accepted_total")

    async def scenario() -> None:
        async with running(cfg, CollectorRegistry()):
            pass  # the persistent session exists from here on
        r = current_round(60)
        async with Shuffler(cfg, registry=first) as shuffler:
            task = asyncio.create_task(shuffler.run())
            async with asyncio.timeout(10):
                await shuffler.connected.wait()
            await publish(mosquitto, [(f"a{i}", report(r, i)) for i in range(10)])
            await wait_until(lambda: accepted(first) == 10)
            log = shuffler._log
            assert log is not None
            assert log._fd is not None
            read_only = os.open(os.devnull, os.O_RDONLY)
            os.dup2(read_only, log._fd)  # writes to the log fail from here on (EBADF)
            os.close(read_only)
            await publish(mosquitto, [(f"b{i}", report(r, 100 + i)) for i in range(10)])
            with pytest.raises(OSError, match="Bad file descriptor"):
                async with asyncio.timeout(20):
                    await task
        async with running(cfg, second) as again:
            await wait_until(lambda: accepted(second) >= 10)
            await asyncio.sleep(0.5)  # anything delivered twice would be counted by now
            assert accepted(second) == 10  # every b report, once
            assert again.buffered == 20  # the a reports from the log, the b reports anew
        duplicates = value(
            second, "coco_shuffler_reports_rejected_total", reason="duplicate_in_round"
        )
        assert duplicates == 0

    run(scenario(), 60)


def test_a_message_on_the_publishing_connection_does_not_stop_publishing(
    mosquitto: Broker,
) -> None:
    """The publishing connection subscribes to nothing, but the embedded amqtt broker of
    ``coco demo`` once delivered another client's retained message on it (1 demo run in
    about 15), and the shuffler took that message for the end of the connection: it never
    published again (3,000 reports released, none published). Here a real broker delivers
    messages on it (the test subscribes it to a topic, as that broker did unasked): the
    rounds that follow are still published, every report once."""
    registry = CollectorRegistry()
    stray = f"coco/v1/{DEP}/aggregator/lease"

    async def scenario() -> None:
        async with batches(mosquitto) as sink, running(config(mosquitto), registry) as shuffler:
            await wait_until(lambda: shuffler._client is not None, what="the publisher")
            client = shuffler._client
            assert client is not None
            await client.subscribe(stray, qos=1)
            async with aiomqtt.Client("127.0.0.1", mosquitto.port) as other:
                for k in range(3):
                    await other.publish(stray, f"stray {k}".encode(), qos=1, retain=k == 0)
                r = await round_start()
                await publish(mosquitto, [(f"dev-{i}", report(r, i)) for i in range(8)])
            await wait_until(lambda: sink.count() == 8, progress=sink.count, what="the batch")
            assert shuffler._client is client  # the same connection, still up
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as cleaner:
            await cleaner.publish(stray, b"", qos=1, retain=True)

    run(scenario())
    assert value(registry, "coco_shuffler_reports_released_total") == 8
