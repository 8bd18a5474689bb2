"""The service keeps the per-round series across restarts: the same rows as an uninterrupted
run, from the checkpoint and the series file (and the broker's redelivery of what the
checkpoint lacks), after a crash, after a checkpoint rolled back to its previous generation,
and read offline (:func:`~aggregator.service.series_file.load_series`).

The service runs in-process without a broker: batches go through
:meth:`Aggregator.handle_batch` as the MQTT session would hand them over, and a crash is the
directory's files copied at that moment (everything written is ``fsync`` ed first). The
process-level ``kill -9``: tests/faults/test_exactly_once.py.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from numpy.typing import NDArray
from typer.testing import CliRunner

from aggregator.estimation.estimators import AggregateState
from aggregator.series.core import Series
from aggregator.service.checkpoint_files import previous_path
from aggregator.service.cli import aggregator_app
from aggregator.service.config import AggregatorConfig
from aggregator.service.core.batch_codec import encode_batch_arrays
from aggregator.service.series_file import SeriesFileError, load_series, series_path_for
from aggregator.service.service import Aggregator
from edge.batch_auth import BatchSigner, BatchVerifier
from edge.codec import decode_batch
from edge.spec import MechanismSpec
from tests.aggregator.test_series_core import fingerprint

pytestmark = pytest.mark.timeout(180)

SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
DEP = "series"
R = 60
SIGNER = BatchSigner(Ed25519PrivateKey.generate(), DEP)


def batches(seed: int, rounds: int = 8, per_round: int = 3) -> list[tuple[int, bytes, int]]:
    """(round, sealed batch, size) for ``rounds`` recent rounds."""
    rng = np.random.default_rng(seed)
    first = int(time.time()) // R - rounds - 2
    out = []
    for k in range(rounds * per_round):
        round_ = first + k // per_round
        size = int(rng.integers(20, 60))
        seeds = rng.integers(0, 2**32, size=size, dtype=np.uint64).astype(np.uint32)
        z = rng.integers(0, SPEC.t, size=size).astype(np.uint16)
        payload = encode_batch_arrays(
            SPEC.fingerprint_int, round_, (seed * 1000 + k).to_bytes(16, "big"), seeds, z
        )
        out.append((round_, SIGNER.seal(payload), size))
    return out


def config(workdir: Path, **kwargs: object) -> AggregatorConfig:
    options: dict[str, object] = {
        "broker": "mqtt://127.0.0.1:1",
        "deployment": DEP,
        "spec": SPEC,
        "delta": 1e-6,
        "min_batch": 10,
        "batch_public_key": SIGNER.public_key_hex,
        "checkpoint": workdir / "agg.json",
        "http_port": None,
        "round_seconds": R,
    }
    options.update(kwargs)
    return AggregatorConfig(**options)  # type: ignore[arg-type]


def rows(series: Series | None) -> list[tuple[object, ...]]:
    """Every row's identity and sums (:func:`tests.aggregator.test_series_core.fingerprint`)."""
    assert series is not None
    return fingerprint(series)


async def serve(
    workdir: Path,
    plan: list[tuple[int, bytes, int]],
    *,
    every: int = 4,
    crash_after: int | None = None,
    crash_dir: Path | None = None,
) -> list[tuple[object, ...]]:
    """Apply ``plan`` with a checkpoint every ``every`` batches, then stop cleanly; with
    ``crash_after``, the files as they are after that many batches are copied to
    ``crash_dir`` (a ``kill -9`` there: applied since the last checkpoint, not written)."""
    async with Aggregator(config(workdir)) as agg:
        for k, (_round, payload, _size) in enumerate(plan, 1):
            assert await agg.handle_batch(payload) in ("applied", "duplicate")
            if k % every == 0:
                await agg.checkpoint()
            if k == crash_after and crash_dir is not None:
                shutil.copytree(workdir, crash_dir)
        series = agg.core.series
    return rows(series)


def per_round(plan: list[tuple[int, bytes, int]]) -> dict[int, tuple[int, list[int]]]:
    """Each round's n and sum_u, recomputed from the batches themselves."""
    states: dict[int, AggregateState] = {}
    for round_, payload, _size in plan:
        seeds, z = decode(payload)
        states.setdefault(round_, AggregateState(SPEC)).add(seeds, z)
    return {r: (s.n, s.sum_u.tolist()) for r, s in sorted(states.items())}


def decode(payload: bytes) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    inner = bytes(BatchVerifier(SIGNER.public_key_hex, DEP).open(payload))
    _fp, _round, _id, seeds, z = decode_batch(inner)
    return np.asarray(seeds, dtype=np.uint64), np.asarray(z, dtype=np.int64)


@pytest.mark.parametrize("rolled_back", [False, True], ids=["crash", "crash-rolled-back"])
def test_a_restart_from_checkpoint_and_series_file_gives_the_same_rows(
    tmp_path: Path, rolled_back: bool
) -> None:
    plan = batches(seed=5)
    reference = asyncio.run(serve(tmp_path / "reference", plan))
    expected = per_round(plan)
    assert {r[0]: (r[3], r[4]) for r in reference} == expected
    assert len(reference) == 8

    crashed = tmp_path / "crashed"
    asyncio.run(serve(tmp_path / "first", plan, crash_after=15, crash_dir=crashed))
    checkpoint = crashed / "agg.json"
    if rolled_back:  # as after a takeover, or a damaged newest generation
        previous_path(checkpoint).replace(checkpoint)
    # the restart: every batch redelivered (those the checkpoint holds are duplicates)
    again = asyncio.run(serve(crashed, plan))
    assert again == reference
    assert rows(load_series(checkpoint)) == reference


def test_a_damaged_series_file_stops_the_start_and_new_series_starts_anew(
    tmp_path: Path,
) -> None:
    plan = batches(seed=9, rounds=4)
    asyncio.run(serve(tmp_path, plan))
    path = series_path_for(tmp_path / "agg.json")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))

    async def start(**kwargs: object) -> Aggregator:
        async with Aggregator(config(tmp_path, **kwargs)) as agg:
            return agg

    with pytest.raises(SeriesFileError) as caught:
        asyncio.run(start())
    assert "\n" not in str(caught.value)
    assert "--new-series" in str(caught.value)
    agg = asyncio.run(start(new_series=True))
    assert agg.core.series is not None
    assert len(agg.core.series) == 0
    assert agg.state.n == sum(size for _, _, size in plan)  # the cumulative sums stay
    assert path.with_name(path.name + ".old").read_bytes() == bytes(data)
    asyncio.run(start())  # and the next start is a plain one again


def test_the_series_command_reads_a_stopped_service_s_checkpoint(tmp_path: Path) -> None:
    """``coco aggregator series --checkpoint``: the stopped service's rows, each with the
    estimate of the round's own batches (JSON and CSV), and one line for what it cannot read."""
    plan = batches(seed=9)
    asyncio.run(serve(tmp_path, plan))
    checkpoint = tmp_path / "agg.json"
    runner = CliRunner()
    result = runner.invoke(aggregator_app, ["series", "--checkpoint", str(checkpoint)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    expected = per_round(plan)
    assert [row[0] for row in document["rows"]] == sorted(expected)
    for row in document["rows"]:
        n, _ = expected[row[0]]
        state = AggregateState(SPEC)
        for round_, payload, _size in plan:
            if round_ == row[0]:
                state.add(*decode(payload))
        assert row[4] == n
        assert row[7] == state.estimate().to_dict()
    table = runner.invoke(
        aggregator_app,
        ["series", "--checkpoint", str(checkpoint), "--dims", "0", "--format", "csv"],
    )
    assert table.exit_code == 0, table.output
    assert len(table.stdout.splitlines()) == 1 + len(expected)
    missing = runner.invoke(aggregator_app, ["series", "--checkpoint", str(tmp_path / "no.json")])
    assert missing.exit_code == 1
    assert len(missing.stderr.strip().splitlines()) == 1
    both = runner.invoke(
        aggregator_app, ["series", "--checkpoint", str(checkpoint), "--url", "http://x:1"]
    )
    assert both.exit_code == 1
    assert "exactly one of --url and --checkpoint" in both.stderr
