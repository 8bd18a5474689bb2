"""Coverage of the mean intervals at small counts, by seeded Monte Carlo through the real
hash family and randomisers (docs/estimates.md, "Means at small counts").

Dimension 0 of ``d = 16``, ``s = 2`` is held by each report with probability 0.04, its entry
``+1`` with probability ``(1 + theta)/2``; every trial draws fresh data and reports, so the
number of intervals holding the truth is binomial. Prints, per mechanism and ``n``, the
measured coverage with its binomial standard error beside the exact value of
:mod:`tests.aggregator.exact_mean_coverage` (``--exact``; slow at large ``n``).

Run from the repository root::

    .venv/bin/python bench/bench_mean_coverage.py [--trials 20000] [--n 100 300]
        [--theta 1] [--exact]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from aggregator.estimation.estimators import AggregateState
from edge import LocalMechanism, MechanismSpec
from tests.aggregator.exact_mean_coverage import EPSILON, SHAPE, SHARE, average_coverage

CHUNK = 2000
"""Trials randomised at once (bounds the memory of the report arrays)."""


def coverage(spec: MechanismSpec, n: int, theta: float, trials: int, seed: int) -> float:
    mech = LocalMechanism.from_spec(spec)
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, trials, CHUNK):
        count = min(CHUNK, trials - start)
        rows = n * count
        keys = 1 + np.argsort(rng.random((rows, spec.d - 1)), axis=1)[:, : spec.s]
        holds = rng.random(rows) < SHARE
        keys[holds, 0] = 0
        signs = np.where(rng.random((rows, spec.s)) < 0.5, 1, -1).astype(np.int8)
        signs[holds, 0] = np.where(rng.random(int(holds.sum())) < (1 + theta) / 2, 1, -1)
        x0 = np.where(holds, signs[:, 0], 0)
        seeds, z = mech.randomise_sparse(keys, signs, rng)
        for k in range(count):
            part = slice(k * n, (k + 1) * n)
            state = AggregateState(spec)
            state.add(seeds[part], z[part])
            est = state.estimate()
            truth = x0[part].mean()
            hits += int(est.mean_lo[0] <= truth <= est.mean_hi[0])
    return hits / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20_000)
    parser.add_argument("--n", type=int, nargs="+", default=[100, 300])
    parser.add_argument("--theta", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--exact", action="store_true")
    args = parser.parse_args()
    for mechanism in ("coco", "collision"):
        spec = MechanismSpec(mechanism=mechanism, d=SHAPE[0], s=SHAPE[1], epsilon=EPSILON)
        for n in args.n:
            got = coverage(spec, n, args.theta, args.trials, args.seed + n)
            se = math.sqrt(got * (1 - got) / args.trials)
            line = f"{mechanism:9s} n={n:5d} theta={args.theta:g}: {got:.4f} +- {se:.4f}"
            if args.exact:
                line += f"  exact {average_coverage(spec, n, SHARE, args.theta).published:.4f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
