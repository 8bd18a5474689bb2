"""Sampled reports follow the exact law, on the device path and the batch path alike.

Seeded chi-square goodness-of-fit tests at significance 1e-4 (per test; about 20 tests):
with the seeds fixed they are deterministic, and a sampler whose law differs from
``probabilities`` by a few percent in any bucket fails them.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from scipy.stats import chi2_contingency, chisquare

from edge import CoCo, Collision, LocalMechanism
from tests.edge.test_privacy import colliding_input, random_input

ALPHA = 1e-4
DRAWS = 30_000
CASES = [
    (CoCo, 10, 3, 0.6931471805599453, 8),
    (CoCo, 64, 8, 1.0, None),
    (Collision, 6, 2, 0.6931471805599453, 4),
    (Collision, 64, 8, 1.0, None),
]


def inputs(m: LocalMechanism, rnd: random.Random) -> list[tuple[np.ndarray, int]]:
    """A random input and a hash-colliding one, each with its seed."""
    seed = rnd.getrandbits(32)
    out = [(random_input(rnd, m.d, m.s), seed)]
    for seed in range(1000):
        x = colliding_input(m, seed, m.d, m.s)
        if x is not None:
            out.append((x, seed))
            break
    return out


def fit_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    return float(chisquare(counts, probs * counts.sum()).pvalue)


@pytest.mark.parametrize(("kind", "d", "s", "eps", "t"), CASES)
def test_device_path_follows_the_exact_law(
    kind: type[LocalMechanism], d: int, s: int, eps: float, t: int | None
) -> None:
    m = kind(d=d, s=s, epsilon=eps, t=t)
    rnd = random.Random(1)
    for x, seed in inputs(m, rnd):
        keys = [int(j) for j in np.flatnonzero(x)]
        signs = [int(x[j]) for j in keys]
        counts = np.zeros(m.t)
        for _ in range(DRAWS):
            counts[m._device_randomise(keys, signs, seed, rnd.getrandbits)] += 1
        assert fit_pvalue(counts, m.probabilities(x, seed)) > ALPHA


@pytest.mark.parametrize(("kind", "d", "s", "eps", "t"), CASES)
def test_batch_path_follows_the_exact_law(
    kind: type[LocalMechanism], d: int, s: int, eps: float, t: int | None
) -> None:
    m = kind(d=d, s=s, epsilon=eps, t=t)
    rng = np.random.default_rng(2)
    for x, seed in inputs(m, random.Random(2)):
        keys = np.tile(np.flatnonzero(x), (DRAWS, 1)).astype(np.int64)
        signs = np.tile(x[np.flatnonzero(x)], (DRAWS, 1)).astype(np.int8)
        seeds = np.full(DRAWS, seed, dtype=np.uint32)
        z = m._batch_z(keys, signs, seeds, rng)
        assert fit_pvalue(np.bincount(z, minlength=m.t), m.probabilities(x, seed)) > ALPHA


@pytest.mark.parametrize(("kind", "d", "s", "eps", "t"), CASES)
def test_paths_agree_with_random_seeds(
    kind: type[LocalMechanism], d: int, s: int, eps: float, t: int | None
) -> None:
    """Over fresh random seeds (the real use), the public single-report and batch APIs
    give the same law of z: a two-sample chi-square test of homogeneity."""
    m = kind(d=d, s=s, epsilon=eps, t=t)
    rnd = random.Random(3)
    x = random_input(rnd, d, s)
    device_z = [m.randomise(x, getrandbits=rnd.getrandbits)[1] for _ in range(DRAWS // 2)]
    _, batch_z = m.randomise_batch(np.tile(x, (DRAWS // 2, 1)), np.random.default_rng(3))
    table = np.vstack([np.bincount(device_z, minlength=m.t), np.bincount(batch_z, minlength=m.t)])
    table = table[:, table.sum(axis=0) > 0]
    assert chi2_contingency(table).pvalue > ALPHA


def test_seeds_are_uniform_32_bit() -> None:
    m = CoCo(d=8, s=2, epsilon=1.0)
    keys = np.tile([1, 5], (DRAWS, 1))
    signs = np.tile([1, -1], (DRAWS, 1))
    seeds, z = m.randomise_sparse(keys, signs, np.random.default_rng(4))
    assert seeds.dtype == np.uint32
    assert z.min() >= 0
    assert z.max() < m.t
    # The top 4 bits of the seeds are uniform over 16 values.
    assert (
        fit_pvalue(np.bincount(seeds >> np.uint32(28), minlength=16), np.full(16, 1 / 16)) > ALPHA
    )


def test_a_biased_sampler_is_caught() -> None:
    """The test has power: moving 3% of the mass between two buckets fails it."""
    m = Collision(d=6, s=2, epsilon=0.6931471805599453, t=4)
    x = np.array([0, 0, 1, 0, -1, 0])
    p = m.probabilities(x, 7)
    wrong = p.copy()
    wrong[0] += 0.03
    wrong[1] -= 0.03
    rng = np.random.default_rng(5)
    counts = np.bincount(rng.choice(m.t, size=DRAWS, p=wrong), minlength=m.t)
    assert fit_pvalue(counts, p) < ALPHA
