"""Offline simulation, vectorised (no MQTT): data -> encode -> randomise -> estimate.

* :func:`simulate`: the paper's random s-sparse ternary vectors; errors against theory.
* :func:`simulate_sensors`: real-valued readings of a :class:`~sim.models.sensors.SensorFleet`
  through the sensor encoder; per trial and channel the decoded estimate, the half-width of
  its 95% interval and the fleet's true mean, so anyone can measure the intervals' coverage.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields
from statistics import NormalDist
from typing import Any

import numpy as np
from numpy.typing import NDArray

from aggregator.estimation.estimators import AggregateState
from edge import LocalMechanism, MechanismSpec
from sim.models.sensors import SensorFleet
from sim.models.synthetic import random_sparse, sparse_totals

CHUNK = 100_000
"""Reports generated and aggregated at a time, so memory stays flat as n grows."""


@dataclass(frozen=True, kw_only=True)
class _Setting:
    """What every simulation result starts with: the spec's parameters and the run's size."""

    mechanism: str
    d: int
    s: int
    epsilon: float
    t: int
    n: int
    trials: int
    seed: int

    @staticmethod
    def of(spec: MechanismSpec, *, n: int, trials: int, seed: int) -> dict[str, Any]:
        """The setting's fields of a run of ``spec`` (keyword arguments of a result)."""
        return {
            "mechanism": spec.mechanism,
            "d": spec.d,
            "s": spec.s,
            "epsilon": spec.epsilon,
            "t": spec.t,
            "n": n,
            "trials": trials,
            "seed": seed,
        }

    def setting(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(_Setting)}


@dataclass(frozen=True, kw_only=True)
class SimulationResult(_Setting):
    """Errors of the estimates over ``trials`` independent runs of ``n`` reports each.

    ``mse_*`` is the sum over dimensions of the squared error, averaged over trials;
    ``*_theory`` its closed form (:mod:`edge.theory`); ``max_abs_error_mean`` the largest
    absolute error of a mean estimate over dimensions, averaged over trials.
    """

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
        **_Setting.of(spec, n=n, trials=trials, seed=seed),
        mse_mean=float(np.mean(sq_mean)),
        mse_mean_theory=moments.mean_mse(spec.d, spec.s) / n,
        mse_freq=float(np.mean(sq_freq)),
        mse_freq_theory=moments.freq_mse(spec.d, spec.s) / n,
        max_abs_error_mean=float(np.mean(max_err)),
        elapsed_seconds=time.perf_counter() - start,
    )


Z95 = NormalDist().inv_cdf(0.975)
"""Normal quantile of a two-sided 95% interval (1.95996...)."""

ROUNDS = 24
"""Rounds of the sensor fleet the trials cycle through (a day of hourly rounds)."""


@dataclass(frozen=True, kw_only=True)
class SensorSimulationResult(_Setting):
    """Estimates of a sensor fleet's channel means over ``trials`` trials of ``n`` devices.

    Trial ``k`` reads round ``k mod 24`` (:data:`ROUNDS`: a day of hourly rounds, before the
    devices' drift takes them far from their first readings) of
    ``SensorFleet(n_devices=n, channels=d, seed=seed)``; each device sends one report,
    encoded and randomised afresh. ``estimate[k, j]`` is the decoded mean of channel ``j``,
    ``ci95_halfwidth[k, j]`` the half-width of its 95% interval
    (:meth:`~edge.encoders.SensorEncoder.decode_mean`), ``truth[k, j]`` the fleet's exact
    mean of the readings (simulation only).
    """

    channels: tuple[str, ...]
    units: tuple[str, ...]
    estimate: NDArray[np.float64]
    ci95_halfwidth: NDArray[np.float64]
    truth: NDArray[np.float64]
    elapsed_seconds: float

    @property
    def covered(self) -> NDArray[np.bool_]:
        """``(trials, d)``: whether each interval holds the truth."""
        hit: NDArray[np.bool_] = np.abs(self.estimate - self.truth) <= self.ci95_halfwidth
        return hit

    @property
    def coverage(self) -> NDArray[np.float64]:
        """Share of trials whose interval holds the truth, per channel."""
        share: NDArray[np.float64] = self.covered.mean(axis=0)
        return share

    def to_dict(self) -> dict[str, Any]:
        named = list(zip(self.channels, self.units, strict=True))
        return {
            "model": "sensors",
            **self.setting(),
            "coverage": {
                name: float(c) for name, c in zip(self.channels, self.coverage, strict=True)
            },
            "per_trial": [
                {
                    "trial": k,
                    "channels": [
                        {
                            "name": name,
                            "unit": unit,
                            "estimate": float(self.estimate[k, j]),
                            "ci95_halfwidth": float(self.ci95_halfwidth[k, j]),
                            "truth": float(self.truth[k, j]),
                        }
                        for j, (name, unit) in enumerate(named)
                    ],
                }
                for k in range(self.trials)
            ],
            "elapsed_seconds": self.elapsed_seconds,
        }


def simulate_sensors(
    spec: MechanismSpec, *, n: int, seed: int, trials: int = 1
) -> SensorSimulationResult:
    """Sensor readings -> :class:`~edge.encoders.SensorEncoder` -> ``spec``'s mechanism ->
    decoded means with 95% intervals, for ``trials`` trials of a fleet of ``n`` devices with
    ``spec.d`` channels (:func:`~sim.models.sensors.channel_table`) each keeping ``spec.s`` of them
    (class docs)."""
    if n < 1 or trials < 1:
        raise ValueError(f"need n >= 1 and trials >= 1, got n={n}, trials={trials}")
    fleet = SensorFleet(n_devices=n, channels=spec.d, seed=seed)
    encoder = fleet.encoder(spec.s)
    mech = LocalMechanism.from_spec(spec)
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(3)[2])
    start = time.perf_counter()
    estimate = np.empty((trials, spec.d))
    halfwidth = np.empty((trials, spec.d))
    truth = np.empty((trials, spec.d))
    per_block = max(1, CHUNK // n)  # small fleets: several trials per vectorised pass
    for first in range(0, trials, per_block):
        block = range(first, min(trials, first + per_block))
        rows = np.concatenate([fleet.readings(k % ROUNDS) for k in block])
        states = [AggregateState(spec) for _ in block]
        for lo in range(0, rows.shape[0], CHUNK):
            hi = min(rows.shape[0], lo + CHUNK)
            keys, signs = encoder.encode_batch(rows[lo:hi], rng)
            seeds, z = mech.randomise_sparse(keys, signs, rng)
            for i in range(lo // n, (hi - 1) // n + 1):  # the trials these rows belong to
                a, b = max(lo, i * n) - lo, min(hi, (i + 1) * n) - lo
                states[i].add(seeds[a:b], z[a:b])
        for i, k in enumerate(block):
            est = states[i].estimate()
            estimate[k], se = encoder.decode_mean(est.mean, est.mean_se, n=n)
            halfwidth[k] = Z95 * se
            truth[k] = rows[i * n : (i + 1) * n].mean(axis=0)
    return SensorSimulationResult(
        **_Setting.of(spec, n=n, trials=trials, seed=seed),
        channels=fleet.names,
        units=tuple(ch.unit for ch in fleet.channel_specs),
        estimate=estimate,
        ci95_halfwidth=halfwidth,
        truth=truth,
        elapsed_seconds=time.perf_counter() - start,
    )
