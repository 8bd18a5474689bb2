"""Shared pieces of the baselines: input validation, exact ``e^eps`` and Gu et al.'s
padding-and-sampling.

Exactness: every discrete baseline derives its probabilities from a *rational* value of
``e^eps``, ``floor(e^eps * 2^24) / 2^24`` (:func:`edge.spec.exp_eps_weight`, rounded down so
the realised budget never exceeds the nominal one). The sampler uses the floats of those
exact probabilities and the exact audit uses the fractions themselves, so the audited
distribution is the sampled one.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from edge import device
from edge.spec import exp_eps_weight


def exp_rational(epsilon: float) -> Fraction:
    """``E = floor(e^epsilon * 2^24) / 2^24``: an exact rational with ``E <= e^epsilon``."""
    return Fraction(exp_eps_weight(epsilon), device.WEIGHT_UNIT)


def check_parameters(d: int, s: int, epsilon: float) -> None:
    """Validate ``(d, s, epsilon)`` with messages that name the value."""
    if d < 2:
        raise ValueError(f"d must be >= 2, got {d}")
    if not 1 <= s <= d:
        raise ValueError(f"s must be in [1, d={d}], got {s}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
    if exp_eps_weight(epsilon) <= device.WEIGHT_UNIT:
        raise ValueError(f"epsilon={epsilon} is too small for a 2^-24 resolution of e^epsilon")


def check_input(
    keys: NDArray[np.int64], signs: NDArray[np.int8], d: int, s: int
) -> tuple[NDArray[np.int64], NDArray[np.int8]]:
    """Validate a population (see :mod:`sim.experiments.baselines.base`); return it as int64 /
    int8 arrays. Raises ``ValueError`` naming the first problem found."""
    keys = np.asarray(keys)
    signs = np.asarray(signs)
    if keys.ndim != 2 or keys.shape[1] != s:
        raise ValueError(f"keys must have shape (n, s={s}), got {keys.shape}")
    if signs.shape != keys.shape:
        raise ValueError(f"signs must have the shape of keys {keys.shape}, got {signs.shape}")
    if keys.shape[0] == 0:
        raise ValueError("the population is empty (n = 0)")
    if not np.issubdtype(keys.dtype, np.integer):
        raise ValueError(f"keys must be integers, got dtype {keys.dtype}")
    if keys.min() < 0 or keys.max() >= d:
        raise ValueError(f"keys must lie in [0, d={d}), got range [{keys.min()}, {keys.max()}]")
    if not np.all(np.abs(signs) == 1):
        raise ValueError("signs must all be +1 or -1")
    if s > 1 and np.any(np.diff(np.sort(keys, axis=1), axis=1) == 0):
        raise ValueError("keys must be distinct within each row (exactly s non-zeros)")
    return keys.astype(np.int64, copy=False), signs.astype(np.int8, copy=False)


def true_frequencies(
    keys: NDArray[np.int64], signs: NDArray[np.int8], d: int
) -> NDArray[np.float64]:
    """The ``(2, d)`` item frequencies the estimators target (share of users with
    ``x_j = +1``, row 0, and ``x_j = -1``, row 1)."""
    n = keys.shape[0]
    plus = np.bincount(keys[signs > 0], minlength=d)
    minus = np.bincount(keys[signs < 0], minlength=d)
    freq: NDArray[np.float64] = np.stack([plus, minus]).astype(np.float64) / n
    return freq


def pad_and_sample(
    keys: NDArray[np.int64],
    signs: NDArray[np.int8],
    d: int,
    ell: int,
    rng: np.random.Generator,
) -> tuple[NDArray[np.int64], NDArray[np.int8]]:
    """Gu et al.'s padding-and-sampling (PCKV, Algorithm 1), vectorised over users.

    A user with ``s <= ell`` pairs adds ``ell - s`` distinct dummy keys drawn from the ``ell``
    dummy keys ``d, ..., d + ell - 1`` (value 0), then samples one of the ``ell`` pairs
    uniformly. A dummy's value 0 is discretised to +1 or -1 with probability 1/2 each. So
    each real pair is sampled with probability ``1/ell`` and each dummy key with probability
    ``(ell - s) / ell^2`` (uniform over the dummy keys), which is what is drawn here.
    Returns the sampled key in ``[0, d + ell)`` and its discretised value.
    """
    n, s = keys.shape
    rows = np.arange(n)
    idx = rng.integers(0, ell, size=n)
    real = idx < s
    real_idx = np.minimum(idx, s - 1)
    dummy_key = d + rng.integers(0, ell, size=n)
    dummy_sign = (2 * rng.integers(0, 2, size=n) - 1).astype(np.int8)
    key = np.where(real, keys[rows, real_idx], dummy_key)
    sign = np.where(real, signs[rows, real_idx], dummy_sign).astype(np.int8)
    return key, sign


def candidate_weights(
    keys_row: list[int], signs_row: list[int], d: int, ell: int
) -> list[tuple[int, int, Fraction]]:
    """Exact law of :func:`pad_and_sample` for one user: ``(key, value, probability)`` with
    ``value`` 0 for a dummy (its discretised sign is uniform, handled by the caller)."""
    s = len(keys_row)
    out = [(k, v, Fraction(1, ell)) for k, v in zip(keys_row, signs_row, strict=True)]
    if ell > s:
        out += [(d + j, 0, Fraction(ell - s, ell * ell)) for j in range(ell)]
    return out


def all_inputs(d: int, s: int) -> list[tuple[list[int], list[int]]]:
    """Every ``s``-sparse ternary vector of dimension ``d`` as ``(keys, signs)`` lists."""
    return [
        (list(ks), list(sg))
        for ks in itertools.combinations(range(d), s)
        for sg in itertools.product((-1, 1), repeat=s)
    ]
