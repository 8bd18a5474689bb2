"""C devices on the wire: libcoco/examples/mosquitto_publish.c (libcoco + Debian's
libmosquitto) joins the real pipeline. A real Mosquitto on a free port holds the retained
announcement; the shuffler and the aggregator run in-process; the C program connects as each
of 300 devices in turn (client id = device id), reads and parses the announcement, encodes
its sensor readings, charges its ledger file, randomises and publishes one report, and waits
for the PUBACK.

It is seeded (``--test-stream``), so the test replays every device in Python with
``edge.device`` and the same stream: every acknowledged report is the expected 16 bytes, is
accepted by the shuffler, released in one batch and aggregated, and the aggregator's
estimates cover the true mean of what the devices encoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import aiomqtt
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from aggregator.estimation.estimators import AggregateState
from aggregator.service.config import AggregatorConfig
from aggregator.service.service import Aggregator
from broker.service.metrics import REJECT_REASONS
from broker.service.shuffler import Shuffler, ShufflerConfig
from edge import device
from edge.announce import encode_announcement
from edge.batch_auth import BatchSigner
from edge.rounds import round_of
from edge.spec import MechanismSpec
from edge.topics import spec_topic
from tests.asyncutil import run, value, wait_until
from tests.conftest import MOSQUITTO, Broker, free_port
from tests.libcoco import build

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
DEP, DEVICES, STREAM_SEED, DATA_SEED, PREFIX = "c-lab", 300, 7, 11, "c-dev-"
K = 4.0  # standard errors: over 6 dimensions a false failure has probability below 1e-3,
# and the run is seeded (deterministic).


@pytest.fixture
def broker_nodelay(tmp_path: Path) -> Iterator[Broker]:
    """A Mosquitto with ``set_tcp_nodelay true``: by default it sends the retained message
    after a SUBACK only once the SUBACK is acknowledged (Nagle's algorithm against the
    client's delayed ACK, about 40 ms per device on Linux), which is most of a device's time
    here (libcoco/README.md, MQTT client)."""
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    broker = Broker(tmp_path, free_port(), extra_config="set_tcp_nodelay true\n")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def round_seconds_away_from_a_boundary(now: float, margin: float = 120.0) -> int:
    """A round length whose current round ends more than ``margin`` seconds from now, so
    that every report of the run falls in one round (no waiting, no wall-clock timing)."""
    for length in range(3600, 600, -1):
        if (round_of(now, length) + 1) * length - now > margin:
            return length
    raise AssertionError("unreachable: some length in (600, 3600] always fits")


def replay() -> tuple[np.ndarray, list[tuple[int, int]]]:
    """What the C devices send, computed in Python: the reports' (seed, z) in order (their
    round is the clock's), and the mean of the encoded ternary vectors (the truth the
    aggregator estimates)."""
    bits = device.xxh32_stream(STREAM_SEED)
    x_sum = np.zeros(SPEC.d)
    records = []
    for i in range(DEVICES):
        readings = [float(device.xxh32_u32(i * 65536 + j, DATA_SEED) % 1024) for j in range(SPEC.d)]
        keys, signs = device.ternarise(readings, [0.0] * SPEC.d, [1023.0] * SPEC.d, SPEC.s, bits)
        for j, b in zip(keys, signs, strict=True):
            x_sum[j] += b
        seed = bits(32)
        z = device.randomise_coco(
            keys, signs, SPEC.d, SPEC.s, SPEC.t, SPEC.exp_eps_weight, seed, bits
        )
        records.append((seed, z))
    return x_sum / DEVICES, records


def test_c_devices_join_the_pipeline(broker_nodelay: Broker, tmp_path: Path) -> None:
    mosquitto = broker_nodelay
    client = build.compile_example(tmp_path)
    length = round_seconds_away_from_a_boundary(time.time())
    signer = BatchSigner.generate(DEP)
    shuffler_registry = CollectorRegistry()
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir()
    reports_file = tmp_path / "reports.hex"
    announcement = encode_announcement(
        SPEC.to_dict(),
        min_batch=DEVICES,
        delta=1e-6,
        round_seconds=length,
        batch_public_key=signer.public_key_hex,
    )

    async def scenario() -> tuple[Aggregator, dict[str, int], str]:
        shuffler = Shuffler(
            ShufflerConfig(
                broker=mosquitto.url,
                deployment=DEP,
                spec=SPEC,
                min_batch=DEVICES,
                release_size=DEVICES,  # released when every device has reported
                round_seconds=length,
                flush_interval=0.1,
                signer=signer,
            ),
            registry=shuffler_registry,
        )
        aggregator = Aggregator(
            AggregatorConfig(
                broker=mosquitto.url,
                deployment=DEP,
                spec=SPEC,
                delta=1e-6,
                batch_public_key=signer.public_key_hex,
                min_batch=DEVICES,
                round_seconds=length,
                http_port=None,
            ),
            registry=CollectorRegistry(),
        )
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as operator:
            await operator.publish(spec_topic(DEP), announcement, qos=1, retain=True)
        async with aggregator, shuffler:
            tasks = [asyncio.create_task(aggregator.run()), asyncio.create_task(shuffler.run())]
            try:
                await wait_until(
                    lambda: aggregator.subscribed.is_set() and shuffler.connected.is_set(), 15
                )
                proc = await asyncio.create_subprocess_exec(
                    str(client), "--port", str(mosquitto.port), "--deployment", DEP,
                    "--devices", str(DEVICES), "--prefix", PREFIX,
                    "--ledger-dir", str(ledgers), "--budget", "10",
                    "--test-stream", str(STREAM_SEED), "--data-seed", str(DATA_SEED),
                    "--reports", str(reports_file),
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                )  # fmt: skip
                stdout, stderr = await asyncio.wait_for(proc.communicate(), 120)
                assert proc.returncode == 0, stderr.decode()
                await wait_until(lambda: aggregator.state.n >= DEVICES, 30)
            finally:
                shuffler.stop()
                for task in tasks:
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*tasks, return_exceptions=True)
        return aggregator, json.loads(stdout), stderr.decode()

    aggregator, summary, stderr = run(scenario(), 170)
    assert summary == {
        "devices": DEVICES, "rounds": 1, "published": DEVICES, "acknowledged": DEVICES,
        "refused": 0, "skipped": 0, "failed": 0,
    }  # fmt: skip
    assert "test-stream" in stderr  # the deterministic stream announces itself

    truth, records = replay()
    check_wire(reports_file, records)
    check_pipeline(shuffler_registry, aggregator, records, truth)
    check_ledgers(ledgers)


def check_wire(reports_file: Path, records: list[tuple[int, int]]) -> None:
    """Every acknowledged report is the 16 bytes Python expects, of the clock's round."""
    sent = [bytes.fromhex(line) for line in reports_file.read_text().split()]
    assert len(sent) == DEVICES
    rounds = {struct.unpack(">BBIIIH", r)[3] for r in sent}
    assert len(rounds) == 1
    (round_,) = rounds
    expected = [
        struct.pack(">BBIIIH", 1, 1, SPEC.fingerprint_int, round_, seed, z) for seed, z in records
    ]
    assert sent == expected


def check_pipeline(
    registry: CollectorRegistry,
    aggregator: Aggregator,
    records: list[tuple[int, int]],
    truth: np.ndarray,
) -> None:
    """Accepted, shuffled into one batch of all of them, aggregated exactly; the estimates
    cover the truth (the mean of the vectors the devices encoded)."""
    assert value(registry, "coco_shuffler_reports_accepted_total") == DEVICES
    for reason in REJECT_REASONS:
        assert value(registry, "coco_shuffler_reports_rejected_total", reason=reason) == 0
    assert value(registry, "coco_shuffler_batches_released_total") == 1
    assert aggregator.state.n == DEVICES
    assert aggregator.counters.batches == 1
    offline = AggregateState(SPEC)
    offline.add(
        np.array([s for s, _ in records], dtype=np.uint32),
        np.array([z for _, z in records], dtype=np.int64),
    )
    np.testing.assert_array_equal(aggregator.state.sum_u, offline.sum_u)
    np.testing.assert_array_equal(aggregator.state.sum_v, offline.sum_v)
    estimates = aggregator.state.estimate()
    assert np.all(np.abs(estimates.mean - truth) <= K * estimates.mean_se), (
        estimates.mean,
        truth,
        estimates.mean_se,
    )


def check_ledgers(ledgers: Path) -> None:
    """Each device's ledger, durably on disk: one report, its epsilon rounded up to 2^-32."""
    cost = -(-Fraction(SPEC.epsilon) * 2**32 // 1)
    for i in range(DEVICES):
        record = (ledgers / f"{PREFIX}{i}.ledger").read_bytes()
        assert record[:8] == b"coLd\x02\x00\x00\x00"
        assert len(record) == 40
        spent, reports = struct.unpack(">QI", record[8:20])
        assert (spent, reports) == (cost, 1)
