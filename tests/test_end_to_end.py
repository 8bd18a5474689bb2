"""End to end, devices -> shuffler -> aggregator, over a real Mosquitto (no mocks).

Checks the pipeline's promises: every report accounted for; the aggregator's sums equal an
offline :class:`AggregateState` of the very reports the devices sent; no device id in a
batch, a metric or an INFO log record; no batch below ``min_batch``; the certified
epsilon_central equals ``coco privacy``'s; and a device written from docs/protocol.md alone
(``mosquitto_pub`` with 16 hand-packed bytes) is accepted and counted.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import struct
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from aggregator.estimation.estimators import AggregateState
from aggregator.ledger.privacy_cli import PrivacyMechanism, privacy_rows
from aggregator.service.config import AggregatorConfig
from aggregator.service.service import Aggregator
from broker.service.metrics import DROP_REASONS, REJECT_REASONS
from broker.service.shuffler import Shuffler, ShufflerConfig
from edge import LocalMechanism, MechanismSpec
from edge.batch_auth import SIGNATURE_SIZE, BatchSigner
from edge.codec import decode_batch
from edge.rounds import current_round
from edge.topics import ingress_topic
from sim.demo.config import DemoConfig, DemoRun
from sim.demo.pipeline import run_pipeline
from tests import asyncutil, pipeline, waiting
from tests.asyncutil import value
from tests.conftest import Broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 45.0) -> T:
    return asyncutil.run(coro, timeout)


wait_until = waiting.Waits(15.0).until


async def pipeline_with_batches(
    broker: Broker, config: DemoConfig, reports: list[tuple[str, int, int, int]]
) -> tuple[DemoRun, list[bytes]]:
    """Run the demo pipeline while a separate client records every batch payload."""
    async with pipeline.recording(broker.port, config.deployment) as recorder:
        outcome = await run_pipeline(config, on_report=lambda *report: reports.append(report))
        released = int(value(outcome.shuffler_registry, "coco_shuffler_batches_released_total"))
        # the last batch reaches the recorder too
        await wait_until(
            lambda: len(recorder.payloads) >= released,
            progress=lambda: len(recorder.payloads),
            what=f"{released} batches recorded",
        )
    return outcome, recorder.payloads


def test_devices_to_aggregator(mosquitto: Broker, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    config = DemoConfig(
        devices=400,
        rounds=3,
        min_batch=150,
        channels=6,
        s=2,
        epsilon=1.0,
        delta=1e-6,
        seed=11,
        broker=mosquitto.url,
        deployment="e2e-test",
        progress=False,
        timeout=40,
    )
    reports: list[tuple[str, int, int, int]] = []
    outcome, payloads = run(pipeline_with_batches(mosquitto, config, reports))
    result, shuffler_reg = outcome.result, outcome.shuffler_registry
    spec = config.spec()

    # every report accounted for: sent = aggregated + rejected + dropped + buffered
    sent = result["reports_sent"]
    assert sent == len(reports) == 1200
    rejected = {
        r: int(value(shuffler_reg, "coco_shuffler_reports_rejected_total", reason=r))
        for r in REJECT_REASONS
    }
    dropped = {
        r: int(value(shuffler_reg, "coco_shuffler_dropped_total", reason=r)) for r in DROP_REASONS
    }
    buffered = int(value(shuffler_reg, "coco_shuffler_buffer_reports")) + int(
        value(shuffler_reg, "coco_shuffler_outbox_reports")
    )
    assert sent == outcome.state.n + sum(rejected.values()) + sum(dropped.values()) + buffered
    assert result["reports_unaccounted"] == 0
    # with complete rounds nothing is lost: the exact-sum check below covers every report
    assert outcome.state.n == sent
    assert not any(rejected.values())
    assert not any(dropped.values())

    # the aggregator's sums equal an offline state of the same (seed, z), exactly
    offline = AggregateState(spec)
    offline.add(
        np.array([r[2] for r in reports], dtype=np.uint32),
        np.array([r[3] for r in reports], dtype=np.int64),
    )
    assert outcome.state.n == offline.n
    np.testing.assert_array_equal(outcome.state.sum_u, offline.sum_u)
    np.testing.assert_array_equal(outcome.state.sum_v, offline.sum_v)

    # every batch >= min_batch, and together they are exactly the reports sent
    assert payloads
    records: list[tuple[int, int]] = []
    for payload in payloads:
        fingerprint, _round, _id, seeds, zs = decode_batch(payload[:-SIGNATURE_SIZE])
        assert fingerprint == spec.fingerprint_int
        assert len(seeds) >= config.min_batch
        records += zip(seeds, zs, strict=True)
    assert sorted(records) == sorted((r[2], r[3]) for r in reports)

    # no device id in a batch, in either registry's metrics, or in an INFO+ log record
    ids = {r[0] for r in reports}
    assert len(ids) == config.devices
    metrics_text = (
        generate_latest(outcome.aggregator_registry).decode()
        + generate_latest(shuffler_reg).decode()
    )
    log_text = "\n".join(record.getMessage() for record in caplog.records)
    for device in ids:
        encoded = device.encode()
        assert all(encoded not in payload for payload in payloads)
        assert device not in metrics_text
        assert device not in log_text

    # the certified epsilon_central of the smallest batch is `coco privacy`'s for that n
    smallest = min(len(decode_batch(p[:-SIGNATURE_SIZE])[3]) for p in payloads)
    assert result["batch_size_smallest"] == smallest
    row = privacy_rows(
        mechanism=PrivacyMechanism.coco,
        epsilon=config.epsilon,
        ns=[smallest],
        delta=config.delta,
        s=spec.s,
        d=spec.d,
        t=spec.t,
    )[0]
    assert result["epsilon_central"] == row["epsilon_central"]
    assert value(
        outcome.aggregator_registry, "coco_aggregator_epsilon_central", batch="smallest"
    ) == pytest.approx(row["epsilon_central"], rel=0, abs=0)


MOSQUITTO_PUB = shutil.which("mosquitto_pub") or "/usr/bin/mosquitto_pub"


@pytest.mark.skipif(not Path(MOSQUITTO_PUB).exists(), reason="mosquitto_pub is not installed")
def test_a_device_built_from_the_protocol_document(mosquitto: Broker, tmp_path: Path) -> None:
    spec = MechanismSpec(mechanism="collision", d=8, s=2, epsilon=1.0)
    dep, min_batch = "protocol-test", 6
    round_ = current_round(3600)  # docs/protocol.md, "Rounds": floor(unix_time / round_seconds)
    mech = LocalMechanism.from_spec(spec)
    rng = np.random.default_rng(5)
    hand_built: list[tuple[int, int]] = []
    files: list[tuple[str, Path]] = []
    for i in range(min_batch):
        keys = sorted(int(k) for k in rng.choice(spec.d, size=spec.s, replace=False))
        signs = [int(v) for v in rng.choice([-1, 1], size=spec.s)]
        seed, z = mech.randomise_keys(keys, signs)
        # docs/protocol.md, the report: version 1, kind 1, fingerprint, round, seed, z
        data = struct.pack(">BBIIIH", 1, 1, spec.fingerprint_int, round_, seed, z)
        assert len(data) == 16
        path = tmp_path / f"report-{i}.bin"
        path.write_bytes(data)
        files.append((f"hand-made-{i}", path))
        hand_built.append((seed, z))

    signer = BatchSigner.generate(dep)

    async def scenario() -> tuple[Aggregator, CollectorRegistry]:
        shuffler_reg = CollectorRegistry()
        shuffler = Shuffler(
            ShufflerConfig(
                broker=mosquitto.url,
                deployment=dep,
                spec=spec,
                min_batch=min_batch,
                release_size=min_batch,  # released when full, not when the hour ends
                round_seconds=3600,
                flush_interval=0.2,
                drain_timeout=5.0,
                signer=signer,
            ),
            registry=shuffler_reg,
        )
        aggregator = Aggregator(
            AggregatorConfig(
                broker=mosquitto.url,
                deployment=dep,
                spec=spec,
                delta=1e-6,
                http_port=None,
                batch_public_key=signer.public_key_hex,
                min_batch=min_batch,
            ),
        )
        async with pipeline.services(shuffler, aggregator):
            for device, path in files:
                proc = await asyncio.create_subprocess_exec(
                    MOSQUITTO_PUB, "-h", "127.0.0.1", "-p", str(mosquitto.port),
                    "-q", "1", "-t", ingress_topic(dep, device), "-f", str(path),
                )  # fmt: skip
                assert await asyncio.wait_for(proc.wait(), waiting.scaled(10)) == 0
            await wait_until(
                lambda: aggregator.state.n >= min_batch, progress=lambda: aggregator.state.n
            )
        return aggregator, shuffler_reg

    aggregator, shuffler_reg = run(scenario())
    assert value(shuffler_reg, "coco_shuffler_reports_accepted_total") == min_batch
    assert value(shuffler_reg, "coco_shuffler_reports_received_total") == min_batch
    assert aggregator.state.n == min_batch
    assert aggregator.counters.batches == 1
    offline = AggregateState(spec)
    offline.add(
        np.array([s for s, _ in hand_built], dtype=np.uint32),
        np.array([z for _, z in hand_built], dtype=np.int64),
    )
    np.testing.assert_array_equal(aggregator.state.sum_u, offline.sum_u)
    np.testing.assert_array_equal(aggregator.state.sum_v, offline.sum_v)
