"""Offline simulation: random s-sparse vectors -> randomise -> estimate, against theory."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from aggregator.estimators import AggregateState
from edge import LocalMechanism, MechanismSpec
from sim.synthetic import random_sparse, sparse_totals

CHUNK = 100_000
"""Reports generated and aggregated at a time, so memory stays flat as n grows."""


@dataclass(frozen=True, kw_only=True)
class SimulationResult:
    """Errors of the estimates over ``trials`` independent runs of ``n`` reports each.

    ``mse_*`` is the sum over dimensions of the squared error, averaged over trials;
    ``*_theory`` its closed form (:mod:`edge.theory`); ``max_abs_error_mean`` the largest
    absolute error of a mean estimate over dimensions, averaged over trials.
    """

    mechanism: str
    d: int
    s: int
    epsilon: float
    t: int
    n: int
    trials: int
    seed: int
    mse_mean: float
    mse_mean_theory: float
    mse_freq: float
    mse_freq_theory: float
    max_abs_error_mean: float
    elapsed_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def simulate(spec: MechanismSpec, *, n: int, seed: int, trials: int = 1) -> SimulationResult:
    """Run the paper's synthetic experiment for ``spec`` (keys uniform, signs +1/-1)."""
    if n < 1 or trials < 1:
        raise ValueError(f"need n >= 1 and trials >= 1, got n={n}, trials={trials}")
    mech = LocalMechanism.from_spec(spec)
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    sq_mean, sq_freq, max_err = [], [], []
    for _ in range(trials):
        state = AggregateState(spec)
        total = np.zeros(spec.d, dtype=np.int64)
        present = np.zeros(spec.d, dtype=np.int64)
        for lo in range(0, n, CHUNK):
            keys, signs = random_sparse(min(CHUNK, n - lo), spec.d, spec.s, rng)
            t_chunk, p_chunk = sparse_totals(keys, signs, spec.d)
            total += t_chunk
            present += p_chunk
            state.add(*mech.randomise_sparse(keys, signs, rng))
        est = state.estimate()
        err_mean = est.mean - total / n
        sq_mean.append(float(np.sum(err_mean**2)))
        sq_freq.append(float(np.sum((est.freq - present / n) ** 2)))
        max_err.append(float(np.max(np.abs(err_mean))))
    moments = spec.moments
    return SimulationResult(
        mechanism=spec.mechanism,
        d=spec.d,
        s=spec.s,
        epsilon=spec.epsilon,
        t=spec.t,
        n=n,
        trials=trials,
        seed=seed,
        mse_mean=float(np.mean(sq_mean)),
        mse_mean_theory=moments.mean_mse(spec.d, spec.s) / n,
        mse_freq=float(np.mean(sq_freq)),
        mse_freq_theory=moments.freq_mse(spec.d, spec.s) / n,
        max_abs_error_mean=float(np.mean(max_err)),
        elapsed_seconds=time.perf_counter() - start,
    )
