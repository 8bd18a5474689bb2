"""SUCCINCT (Zhou, Wang, Chan, Fanti, Shi, IEEE S&P 2022, "Locally differentially private
sparse vector aggregation"), the single-bucket user-level protocol: a random-sign sum of the
user's non-zeros, clipped and sent with Laplace noise."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from sim.experiments.baselines._common import check_input, check_parameters
from sim.experiments.baselines.base import KVEstimate

#: Users per chunk when drawing the public signs (bounds memory to ~chunk * d / 8 * 9 bytes).
_CHUNK = 16384

#: Bit ``7 - b`` of byte value ``v`` at ``[v, b]``: np.unpackbits' (big-endian) bit order.
_BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).astype(np.float64)


def clip_threshold(s: int, n: int) -> float:
    """``eta = min(s, sqrt(s ln n) / 2.5)``: Zhou et al.'s clipping range for one bucket.

    The analysis asks for ``eta = O(sqrt(s log(n / beta)))`` (Hoeffding on a sum of ``s``
    random signs, union bound over the ``n`` users); their released code fixes the constant
    to ``sqrt(k ln n) / 2.5`` and so does the paper's comparison. Above ``s`` nothing is
    clipped, so ``eta`` never exceeds ``s`` (their noise uses ``min(2 eta, 2k)``).
    """
    if n < 2:
        raise ValueError(f"n must be >= 2 to set the clipping range, got {n}")
    return min(float(s), math.sqrt(s * math.log(n)) / 2.5)


@dataclass(frozen=True, kw_only=True)
class Succinct:
    """SUCCINCT mean estimation (no frequency estimates: ``freq`` is ``None``).

    Public randomness: user ``i`` has a uniformly random sign vector ``r_i`` in ``{+-1}^d``
    (in a deployment a public per-user seed; the server needs it to decode, so the privacy
    argument holds for every fixed ``r_i``). Randomiser: ``y_i = clip(sum_j r_ij x_ij, -eta,
    eta)``, report ``y_i + Laplace(2 eta / eps)``. Any two inputs move the clipped value by at
    most ``2 eta``, so for every ``r_i`` the density ratio is at most ``e^eps`` (the scale is
    rounded up by one ulp so floating point cannot shrink it).

    Estimator: ``mean_j = (1/n) sum_i r_ij (y_i + noise_i)``. Without clipping it is unbiased
    (signs are independent, ``E[r_ij r_ik] = 0``); with clipping ``E[mean_j] = c mean_j``
    where ``c = E[u_1 clip(u_1 + ... + u_s)]`` (``u`` i.i.d. signs) is
    :meth:`clip_shrinkage`: the clipping bias the paper reports for large ``s`` and ``eps``.
    The original's code finally clips each estimate to [-1, 1]; that is post-processing and
    left to the caller, like the other baselines' projections.

    ``n``: the clipping range needs the population size. ``None`` (the default, what the
    registry builds) takes it from the population passed to :meth:`run`, i.e. the
    simulation grants SUCCINCT the exact ``n`` it assumes known.

    Deviation: Zhou et al.'s code replaces the Laplace noise by a binary randomised
    response of the clipped value when ``2 eta / eps >= eta``; we follow the paper's
    description (Laplace throughout), as its comparison does.
    """

    d: int
    s: int
    epsilon: float
    n: int | None = None
    name: str = field(default="SUCCINCT", init=False)

    def __post_init__(self) -> None:
        check_parameters(self.d, self.s, self.epsilon)
        if self.n is not None and self.n < 2:
            raise ValueError(f"n must be >= 2, got {self.n}")

    def eta(self, n: int) -> float:
        """The clipping range for a population of ``n`` (``self.n`` if it was fixed)."""
        return clip_threshold(self.s, self.n if self.n is not None else n)

    def noise_scale(self, n: int) -> float:
        """Laplace scale ``2 eta / eps``, rounded up by one ulp."""
        return float(np.nextafter(2 * self.eta(n) / self.epsilon, math.inf))

    def pre_noise_value(
        self, keys_row: list[int], signs_row: list[int], r_row: list[int], n: int
    ) -> Fraction:
        """Exact clipped sum ``clip(sum_j r_j x_j, -eta, eta)`` (``eta`` as the exact rational
        value of the float the sampler uses)."""
        eta = Fraction(self.eta(n))
        total = Fraction(sum(r_row[k] * v for k, v in zip(keys_row, signs_row, strict=True)))
        return max(-eta, min(eta, total))

    def clip_shrinkage(self, n: int) -> float:
        """``c = E[u_1 clip(u_1 + ... + u_s, -eta, eta)]`` for i.i.d. uniform signs ``u``."""
        eta, s = self.eta(n), self.s
        total = 0.0
        for m in range(s):  # m of the other s - 1 signs are +1
            rest = 2 * m - (s - 1)
            gap = min(eta, max(-eta, rest + 1)) - min(eta, max(-eta, rest - 1))
            total += math.comb(s - 1, m) * gap / 2
        return float(total / 2 ** (s - 1))

    def reports(
        self, keys: NDArray[np.int64], signs: NDArray[np.int8], rng: np.random.Generator
    ) -> tuple[NDArray[np.int8], NDArray[np.float64]]:
        """The public signs ``r`` (shape ``(n, d)``) and the noisy reports (small ``n``)."""
        keys, signs = check_input(keys, signs, self.d, self.s)
        n = keys.shape[0]
        r = (2 * rng.integers(0, 2, size=(n, self.d)) - 1).astype(np.int8)
        return r, self._noisy(keys, signs, r, n, rng)

    def _noisy(
        self,
        keys: NDArray[np.int64],
        signs: NDArray[np.int8],
        r: NDArray[np.int8],
        n: int,
        rng: np.random.Generator,
    ) -> NDArray[np.float64]:
        rows = np.arange(keys.shape[0])[:, None]
        return self._clip_and_noise(r[rows, keys], signs, n, rng)

    def _clip_and_noise(
        self, r_held: NDArray[np.int8], signs: NDArray[np.int8], n: int, rng: np.random.Generator
    ) -> NDArray[np.float64]:
        """``clip(sum_k r_k x_k) + Laplace`` from the signs ``r`` at the user's keys."""
        total = (r_held.astype(np.int64) * signs).sum(axis=1)
        eta = self.eta(n)
        clipped = np.clip(total.astype(np.float64), -eta, eta)
        noisy: NDArray[np.float64] = clipped + rng.laplace(
            0.0, self.noise_scale(n), size=total.shape[0]
        )
        return noisy

    def run(
        self, keys: NDArray[np.int64], signs: NDArray[np.int8], rng: np.random.Generator
    ) -> KVEstimate:
        """Draw every user's public signs as packed bytes and decode without unpacking:
        ``sum_i bit_ij y_i`` is, per byte column, a 256-bin weighted histogram of the byte
        values times the bit table of a byte (``r = 2 bit - 1``)."""
        keys, signs = check_input(keys, signs, self.d, self.s)
        n, d = keys.shape[0], self.d
        width = (d + 7) // 8
        acc = np.zeros((width, 256), dtype=np.float64)
        noisy_sum = 0.0
        for lo in range(0, n, _CHUNK):
            hi = min(n, lo + _CHUNK)
            raw = rng.integers(0, 256, size=(hi - lo, width), dtype=np.uint8)
            k = keys[lo:hi]
            held = raw[np.arange(hi - lo)[:, None], k // 8] >> (7 - k % 8).astype(np.uint8) & 1
            r_held = 2 * held.astype(np.int8) - 1
            noisy = self._clip_and_noise(r_held, signs[lo:hi], n, rng)
            cells = (np.arange(width) * 256 + raw).ravel()
            acc += np.bincount(
                cells, weights=np.repeat(noisy, width), minlength=width * 256
            ).reshape(width, 256)
            noisy_sum += float(noisy.sum())
        bit_sums = (acc @ _BYTE_BITS).ravel()[:d]  # sum_i bit_ij y_i, big-endian bit order
        mean = (2 * bit_sums - noisy_sum) / n
        return KVEstimate(freq=None, mean=mean)

    @staticmethod
    def decode(r: NDArray[np.int8], noisy: NDArray[np.float64]) -> NDArray[np.float64]:
        """Server side for explicit reports: ``(1/n) sum_i r_ij noisy_i``."""
        mean: NDArray[np.float64] = (r.astype(np.float64).T @ noisy) / noisy.shape[0]
        return mean
