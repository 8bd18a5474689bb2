"""C devices on the wire: libcoco/examples/mosquitto_publish.c (libcoco + Debian's
libmosquitto) joins the real pipeline. A real Mosquitto on a free port holds the retained
announcement; the shuffler and the aggregator run in-process; the C program connects as each
of 1000 devices in turn (client id = device id), reads and parses the announcement, encodes
its sensor readings, charges its ledger file (in a directory it creates), randomises and
publishes one report, and waits for the PUBACK.

It is seeded (``--test-stream``), so the test replays every device in Python with
``edge.device`` and the same stream: every acknowledged report is the expected 16 bytes, is
accepted by the shuffler, released in one batch and aggregated. The example's sensor model
has a known mean per channel, well away from 0 on most of them: the estimates cover the mean
of what the devices encoded and the model's true mean, and are far from 0 where the truth
is, so that random reports (checked too) fail the same checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import struct
import subprocess
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import aiomqtt
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from aggregator.estimation.estimators import AggregateState, Estimates
from aggregator.estimation.intervals import z_score
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

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# epsilon 4 and 1000 devices: the standard error of a mean is about 0.06 (randomiser and
# encoding noise together, f = s/d = 1/2), small enough beside the model's truths of
# +-0.45, +-0.3 and +-0.15 for random output to fail every check below.
SPEC = MechanismSpec(mechanism="coco", d=8, s=4, epsilon=4.0)
DEP, DEVICES, STREAM_SEED, DATA_SEED, PREFIX = "c-lab", 1000, 7, 11, "c-dev-"
CONFIDENCE = 0.95
K = 4.0  # standard errors for every dimension's error: a false failure has probability
# 6e-5 per dimension under the normal approximation, below 1e-3 over 8; the run is seeded.
K_COUNT = 3.0  # standard deviations of the binomial count of covering intervals: at most
# 2 of 8 95% intervals may miss (Binomial(8, 0.05) exceeds that with probability 0.006).
STRONG = 0.5  # |mu_j| from which the truth is far from 0: the interval must exclude 0

# examples/mosquitto_publish.c's sensor model: channel j reads MODEL_CENTRE[j % 8] plus a
# noise uniform on [-MODEL_NOISE, MODEL_NOISE], so the encoder's value 2 x / 1023 - 1 has
# mean mu_j = 2 MODEL_CENTRE[j % 8] / 1023 - 1 (no reading is clipped).
MODEL_CENTRE, MODEL_NOISE = (972, 51, 818, 205, 665, 358, 512, 511), 48


def model_mu() -> np.ndarray:
    """The model's mean of each channel's value in [-1, 1]."""
    return np.array([2 * MODEL_CENTRE[j % 8] / 1023 - 1 for j in range(SPEC.d)])


def model_reading(i: int, j: int) -> float:
    noise = device.xxh32_u32(i * 65536 + j, DATA_SEED) % (2 * MODEL_NOISE + 1) - MODEL_NOISE
    return float(MODEL_CENTRE[j % 8] + noise)


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
        readings = [model_reading(i, j) for j in range(SPEC.d)]
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
    ledgers = tmp_path / "ledgers" / "c"  # the example creates it, parents too
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
                stdout, stderr = await asyncio.wait_for(proc.communicate(), 180)
                assert proc.returncode == 0, stderr.decode()
                await wait_until(lambda: aggregator.state.n >= DEVICES, 30)
            finally:
                shuffler.stop()
                for task in tasks:
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*tasks, return_exceptions=True)
        return aggregator, json.loads(stdout), stderr.decode()

    aggregator, summary, stderr = run(scenario(), 230)
    assert summary == {
        "devices": DEVICES, "rounds": 1, "published": DEVICES, "acknowledged": DEVICES,
        "refused": 0, "skipped": 0, "failed": 0,
    }  # fmt: skip
    assert "test-stream" in stderr  # the deterministic stream announces itself

    encoded, records = replay()
    check_wire(reports_file, records)
    check_pipeline(shuffler_registry, aggregator, records)
    estimates = aggregator.state.estimate(confidence=CONFIDENCE)
    assert coverage_failures(estimates, encoded, model_truth=False) == []
    assert coverage_failures(estimates, SPEC.s / SPEC.d * model_mu(), model_truth=True) == []
    check_ledgers(ledgers)


def test_random_reports_fail_the_coverage_checks() -> None:
    """The checks above can fail: DEVICES uniformly random reports (seeds and z), what a
    broken encoder or randomiser would send, estimate about 0 everywhere and miss the
    model's truth."""
    rng = np.random.default_rng(20250623)
    state = AggregateState(SPEC)
    state.add(
        rng.integers(0, 2**32, DEVICES, dtype=np.uint64).astype(np.uint32),
        rng.integers(0, SPEC.t, DEVICES, dtype=np.int64),
    )
    estimates = state.estimate(confidence=CONFIDENCE)
    failures = coverage_failures(estimates, SPEC.s / SPEC.d * model_mu(), model_truth=True)
    assert any("covered" in f for f in failures), failures
    assert any("exclude 0" in f for f in failures), failures


def test_the_example_creates_its_ledger_directory_or_says_why_not(tmp_path: Path) -> None:
    """mkdir -p for --ledger-dir before anything is sent; where that cannot be done (a
    regular file in the way) a one-line error and exit status 1, no connection attempted."""
    client = build.compile_example(tmp_path)
    (tmp_path / "a-file").write_text("not a directory")
    proc = subprocess.run(
        [str(client), "--deployment", DEP, "--ledger-dir", str(tmp_path / "a-file" / "ledgers"),
         "--port", str(free_port()), "--timeout", "1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr == (
        f"error: cannot create the ledger directory {tmp_path / 'a-file' / 'ledgers'}: "
        "Not a directory\n"
    )
    assert proc.stdout == ""
    nested = tmp_path / "x" / "y" / "z"
    proc = subprocess.run(
        [str(client), "--deployment", DEP, "--ledger-dir", str(nested),
         "--port", str(free_port()), "--timeout", "1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert nested.is_dir()  # created; the device then fails to connect (no broker there)
    assert "cannot connect" in proc.stderr


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
    registry: CollectorRegistry, aggregator: Aggregator, records: list[tuple[int, int]]
) -> None:
    """Accepted, shuffled into one batch of all of them, aggregated exactly."""
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


def coverage_failures(estimates: Estimates, truth: np.ndarray, *, model_truth: bool) -> list[str]:
    """What is wrong with ``estimates`` of ``truth``, per dimension (empty: nothing).

    Against the mean of the vectors the devices encoded (``model_truth`` false) the
    aggregator's own intervals apply: only the randomiser's noise separates the two. Against
    the model's truth ``(s/d) mu_j``, the encoding's noise adds: a device's ``x_j`` is 0, +1
    or -1 with mean ``(s/d) mu_j`` and variance ``s/d - ((s/d) mu_j)^2``, so its variance
    over ``n`` devices is added to the aggregator's. Then:

    * the intervals ``estimate +- z SE`` cover the truth in at least
      ``d c - K_COUNT sqrt(d c (1 - c))`` dimensions (binomial, c the confidence);
    * every error is within ``K`` standard errors;
    * with the model's truth, where ``|mu_j| >= STRONG`` the interval excludes 0 and lies on
      the truth's side: output that does not depend on the readings cannot pass.
    """
    d, n, c = SPEC.d, estimates.n, CONFIDENCE
    var = estimates.mean_se**2
    if model_truth:
        f = SPEC.s / SPEC.d
        var = var + (f - truth**2) / n
    se = np.sqrt(var)
    half = z_score(c) * se
    error = estimates.mean - truth
    failures = []
    covered = int(np.sum(np.abs(error) <= half))
    least = math.ceil(d * c - K_COUNT * math.sqrt(d * c * (1 - c)))
    if covered < least:
        failures.append(f"{covered} of {d} intervals covered the truth, fewer than {least}")
    for j in np.flatnonzero(np.abs(error) > K * se):
        failures.append(f"dimension {j}: error {error[j]:.4f} beyond {K} SE ({se[j]:.4f})")
    if model_truth:
        mu = truth * SPEC.d / SPEC.s
        for j in np.flatnonzero(np.abs(mu) >= STRONG):
            if not np.sign(truth[j]) * estimates.mean[j] > half[j]:
                failures.append(
                    f"dimension {j}: the interval {estimates.mean[j]:.4f} +- {half[j]:.4f} "
                    f"does not exclude 0 on the side of the truth {truth[j]:.4f}"
                )
    return failures


def check_ledgers(ledgers: Path) -> None:
    """Each device's ledger, durably on disk: one report, its epsilon rounded up to 2^-32."""
    cost = -(-Fraction(SPEC.epsilon) * 2**32 // 1)
    for i in range(DEVICES):
        record = (ledgers / f"{PREFIX}{i}.ledger").read_bytes()
        assert record[:8] == b"coLd\x02\x00\x00\x00"
        assert len(record) == 40
        spent, reports = struct.unpack(">QI", record[8:20])
        assert (spent, reports) == (cost, 1)
