"""The per-round series' cost: memory per round and dimension, and what it adds to a checkpoint.

1. Memory: :mod:`tracemalloc` of a :class:`~aggregator.series.core.Series` holding a week of
   60-second rounds (10 080 rows) at ``d`` = 16, 64 and 256, after its changes were taken and
   committed (what stays between checkpoints): bytes per row, and the part that grows with
   ``d`` (fitted as ``a + b d`` over the three sizes), beside the ``16 d`` of the two sums.
2. Checkpoint: two in-process aggregators on this disk, one with the series (a round length)
   and one without, the first holding a week of rows already written to its series file;
   each iteration applies one batch of the current round to both and times ``checkpoint()``
   of each, alternating which goes first; min, median and max of each over the pairs. The
   difference is the series file's append (one record per changed row) and its ``fsync``.

Run: ``.venv/bin/python bench/bench_series.py [--pairs 40] [--d 64] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aggregator.estimation.estimators import AggregateState
from aggregator.series.core import Series
from aggregator.service.config import AggregatorConfig
from aggregator.service.core.batch_codec import encode_batch_arrays
from aggregator.service.series_file import series_path_for
from aggregator.service.service import Aggregator
from edge.batch_auth import BatchSigner
from edge.spec import MechanismSpec

ROUND = 60
WEEK = 7 * 86400
DEP = "bench"


def spec_of(d: int) -> MechanismSpec:
    return MechanismSpec(mechanism="coco", d=d, s=2, epsilon=1.0)


def partial(spec: MechanismSpec, rng: np.random.Generator, size: int = 20) -> AggregateState:
    state = AggregateState(spec)
    state.add(rng.integers(0, 2**32, size=size, dtype=np.uint64), rng.integers(0, spec.t, size))
    return state


def week_of_rounds(series: Series, spec: MechanismSpec, now: int) -> None:
    rng = np.random.default_rng(0)
    first = (now - WEEK) // ROUND + 1
    for round_ in range(first, now // ROUND + 1):
        series.add(round_, partial(spec, rng), batch_size=20)


def memory(d: int) -> dict[str, float]:
    spec = spec_of(d)
    now = int(time.time())
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    series = Series(spec, round_seconds=ROUND, retention=WEEK, step=3600, coarse_retention=0)
    week_of_rounds(series, spec, now)
    series.take()
    series.committed(series.seq)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    rows = len(series)
    return {
        "d": d,
        "rows": rows,
        "bytes": held,
        "bytes_per_row": held / rows,
        "sums_bytes_per_row": 16 * d,
    }


def batch(signer: BatchSigner, spec: MechanismSpec, round_: int, k: int) -> bytes:
    rng = np.random.default_rng(k)
    seeds = rng.integers(0, 2**32, size=50, dtype=np.uint64).astype(np.uint32)
    z = rng.integers(0, spec.t, size=50).astype(np.uint16)
    return signer.seal(
        encode_batch_arrays(spec.fingerprint_int, round_, k.to_bytes(16, "big"), seeds, z)
    )


async def checkpoints(d: int, pairs: int, workdir: Path) -> dict[str, Any]:
    spec = spec_of(d)
    signer = BatchSigner(Ed25519PrivateKey.generate(), DEP)

    def config(name: str, round_seconds: int | None) -> AggregatorConfig:
        return AggregatorConfig(
            broker="mqtt://127.0.0.1:1",
            deployment=DEP,
            spec=spec,
            delta=1e-6,
            min_batch=10,
            batch_public_key=signer.public_key_hex,
            checkpoint=workdir / name / "agg.json",
            http_port=None,
            round_seconds=round_seconds,
        )

    times: dict[str, list[float]] = {"on": [], "off": []}
    async with (
        Aggregator(config("on", ROUND)) as on,
        Aggregator(config("off", None)) as off,
    ):
        assert on.core.series is not None
        assert off.core.series is None
        week_of_rounds(on.core.series, spec, int(time.time()) - ROUND)
        on.core.dirty = True
        started = time.perf_counter()
        await on.checkpoint()  # the week's records: written once
        first = time.perf_counter() - started
        size = series_path_for(workdir / "on" / "agg.json").stat().st_size
        for k in range(pairs):
            round_ = int(time.time()) // ROUND
            order = [("on", on), ("off", off)] if k % 2 == 0 else [("off", off), ("on", on)]
            for name, agg in order:
                assert await agg.handle_batch(batch(signer, spec, round_, 2 * k + 1)) == "applied"
                started = time.perf_counter()
                await agg.checkpoint()
                times[name].append(time.perf_counter() - started)
        rows = len(on.core.series)

    def summary(values: list[float]) -> dict[str, float]:
        ms = [1000 * v for v in values]
        return {"min": min(ms), "median": statistics.median(ms), "max": max(ms)}

    return {
        "d": d,
        "pairs": pairs,
        "rows": rows,
        "series_file_bytes": size,
        "first_checkpoint_ms": 1000 * first,
        "on_ms": summary(times["on"]),
        "off_ms": summary(times["off"]),
        "median_difference_ms": statistics.median(
            1000 * (a - b) for a, b in zip(times["on"], times["off"], strict=True)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes = [memory(d) for d in (16, 64, 256)]
    slope, intercept = np.polyfit([s["d"] for s in sizes], [s["bytes_per_row"] for s in sizes], 1)
    for s in sizes:
        print(
            f"memory, a week of {ROUND}-s rounds at d={s['d']}: {s['rows']} rows, "
            f"{s['bytes'] / 1e6:.1f} MB, {s['bytes_per_row']:.0f} B/row "
            f"(sums alone {s['sums_bytes_per_row']} B)"
        )
    print(f"fit: {intercept:.0f} + {slope:.2f} d bytes per row")
    with tempfile.TemporaryDirectory() as tmp:
        cost = asyncio.run(checkpoints(args.d, args.pairs, Path(tmp)))
    print(
        f"checkpoint at d={cost['d']} with {cost['rows']} rows "
        f"(series file {cost['series_file_bytes'] / 1e6:.1f} MB; the week's first write "
        f"{cost['first_checkpoint_ms']:.0f} ms), {cost['pairs']} alternating pairs:"
    )
    for name in ("on", "off"):
        t = cost[f"{name}_ms"]
        print(
            f"  series {name:3}: min {t['min']:.1f} ms, median {t['median']:.1f} ms, "
            f"max {t['max']:.1f} ms"
        )
    print(f"  median difference per pair: {cost['median_difference_ms']:+.1f} ms")
    if args.json is not None:
        result = {"memory": sizes, "fit": [intercept, slope], "checkpoint": cost}
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
