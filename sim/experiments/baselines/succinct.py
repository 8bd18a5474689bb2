"""SUCCINCT (Zhou, Wang, Chan, Fanti, Shi, IEEE S&P 2022, "Locally differentially private
sparse vector aggregation"), the single-bucket user-level protocol: a random-sign sum of the
user's non-zeros, clipped and sent with Laplace noise, or, as the authors' released code does
whenever the Laplace scale is at least the clipping range, as a one-bit randomised response."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

from sim.experiments.baselines._common import check_input, check_parameters, exp_rational
from sim.experiments.baselines.base import KVEstimate

#: Users per chunk when drawing the public signs (bounds memory to ~chunk * d / 8 * 9 bytes).
_CHUNK = 16384

#: Bit ``7 - b`` of byte value ``v`` at ``[v, b]``: np.unpackbits' (big-endian) bit order.
_BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).astype(np.float64)


def code_clip_range(s: int, n: int) -> float:
    """``sqrt(s ln n) / 2.5``: the clipping range ``clip_r`` of Zhou et al.'s code, unclamped.

    It is also the range of their randomised response, so it matters when it exceeds ``s``
    (``ln n > 6.25 s``, e.g. ``s = 1`` and ``n >= 519``; never for ``s >= 4`` at ``n <= 1e10``).
    """
    if n < 2:
        raise ValueError(f"n must be >= 2 to set the clipping range, got {n}")
    return math.sqrt(s * math.log(n)) / 2.5


def clip_threshold(s: int, n: int) -> float:
    """``eta = min(s, sqrt(s ln n) / 2.5)``: Zhou et al.'s clipping range for one bucket.

    The analysis asks for ``eta = O(sqrt(s log(n / beta)))`` (Hoeffding on a sum of ``s``
    random signs, union bound over the ``n`` users); their released code fixes the constant
    to ``sqrt(k ln n) / 2.5`` and so does the paper's comparison. Above ``s`` nothing is
    clipped, so ``eta`` never exceeds ``s`` (their noise uses ``min(2 eta, 2k)``).
    """
    return min(float(s), code_clip_range(s, n))


@dataclass(frozen=True, kw_only=True)
class Succinct:
    """SUCCINCT mean estimation (no frequency estimates: ``freq`` is ``None``).

    Public randomness: user ``i`` has a uniformly random sign vector ``r_i`` in ``{+-1}^d``
    (in a deployment a public per-user seed; the server needs it to decode, so the privacy
    argument holds for every fixed ``r_i``). Clipped value: ``y_i = clip(sum_j r_ij x_ij, -eta,
    eta)``. Then, as in Zhou et al.'s code (``SVME::estimate_range``: ``if (noise_param >=
    clip_r) T = rr(T, eps, clip_r) else T += laplacian_noise(noise_param)`` with
    ``noise_param = min(2 clip_r, 2k) / eps``), one of two randomisers:

    * randomised response when ``2 eta / eps >= R`` (:meth:`uses_randomised_response`), where
      ``R = sqrt(s ln n) / 2.5`` is their unclamped ``clip_r`` (:func:`code_clip_range`; ``R =
      eta`` unless ``s`` is tiny, so this is ``eps <= 2``): report ``+C R`` with probability
      ``p = 1/2 + (y_i / R) (E - 1) / (2 (E + 1))``, else ``-C R``, ``C = (E + 1) / (E - 1)``
      (their ``rr``: ``p = (v (e^eps - 1) + e^eps + 1) / (2 (1 + e^eps))``, ``v = y / R``,
      output ``+-c_eps R``). ``E[report] = y_i`` and the worst ratio over inputs is
      ``p(eta / R) / p(-eta / R) <= E`` (``= E`` when ``eta = R``). ``E`` is the package's
      rational ``floor(e^eps 2^24) / 2^24 <= e^eps`` (theirs is the float ``exp(eps)``); the
      sampler draws with the float of the exact ``p`` of each possible clipped value
      (:meth:`exact_report_law` is that law, audited exactly).
    * otherwise (``eps > 2``) ``y_i + Laplace(2 eta / eps)``: any two inputs move ``y_i`` by at
      most ``2 eta``, so for every ``r_i`` the density ratio is at most ``e^eps`` (the scale
      is rounded up by one ulp so floating point cannot shrink it).

    Estimator (both branches, as in their code): ``mean_j = (1/n) sum_i r_ij z_i`` for the
    reports ``z_i`` (``E[z_i | y_i] = y_i``, no rescaling). Without clipping it is unbiased
    (signs are independent, ``E[r_ij r_ik] = 0``); with clipping ``E[mean_j] = c mean_j``
    where ``c = E[u_1 clip(u_1 + ... + u_s)]`` (``u`` i.i.d. signs) is
    :meth:`clip_shrinkage`: the clipping bias the paper reports for large ``s`` and ``eps``.
    The original's code finally clips each estimate to [-1, 1]; that is post-processing and
    left to the caller, like the other baselines' projections.

    ``n``: the clipping range needs the population size. ``None`` (the default, what the
    registry builds) takes it from the population passed to :meth:`run`, i.e. the
    simulation grants SUCCINCT the exact ``n`` it assumes known.

    Their code's ``(eps, delta)`` cap ``min(noise_param, 3 sqrt(2k log(2/delta)))`` is left
    out: this is pure ``eps``-LDP, and at their ``delta = 1e-6`` the cap never binds (it is
    ``> 2 clip_r`` for every ``n < e^(28 log(2/delta))``).
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

    def rr_range(self, n: int) -> float:
        """``R``: the range of the randomised response (their unclamped ``clip_r``)."""
        return code_clip_range(self.s, self.n if self.n is not None else n)

    def uses_randomised_response(self, n: int) -> bool:
        """Their switch ``min(2 clip_r, 2k) / eps >= clip_r`` (``min(2 R, 2 s) = 2 eta``),
        evaluated in floating point as their code does: true for ``eps <= 2`` unless ``R > s``."""
        return 2 * self.eta(n) / self.epsilon >= self.rr_range(n)

    @cached_property
    def exp_eps(self) -> Fraction:
        """Rational ``E = floor(e^eps 2^24) / 2^24 <= e^eps`` of the randomised response."""
        return exp_rational(self.epsilon)

    def rr_plus_probability(self, clipped: Fraction, n: int) -> Fraction:
        """Exact ``P[+C R | y] = ((y / R)(E - 1) + E + 1) / (2 (E + 1))`` (their ``rr``)."""
        e, v = self.exp_eps, clipped / Fraction(self.rr_range(n))
        return (v * (e - 1) + e + 1) / (2 * (e + 1))

    def rr_output(self, n: int) -> float:
        """``C R`` with ``C = (E + 1) / (E - 1)``: the report is ``+C R`` or ``-C R``."""
        e = self.exp_eps
        return float((e + 1) / (e - 1) * Fraction(self.rr_range(n)))

    def rr_ldp_ratio(self, n: int) -> Fraction:
        """Exact worst ratio of the randomised response over inputs: ``p(eta) / p(-eta)``
        (``p(-y) = 1 - p(y)``), i.e. ``E`` when ``eta = R``."""
        eta = Fraction(self.eta(n))
        return self.rr_plus_probability(eta, n) / self.rr_plus_probability(-eta, n)

    def exact_report_law(
        self, keys_row: list[int], signs_row: list[int], r_row: list[int], n: int
    ) -> dict[float, Fraction]:
        """The exact law of one user's report (randomised-response branch only): the two
        float outputs ``+-C R`` and their exact probabilities."""
        if not self.uses_randomised_response(n):
            raise ValueError(f"eps={self.epsilon} uses the Laplace branch (no discrete law)")
        plus = self.rr_plus_probability(self.pre_noise_value(keys_row, signs_row, r_row, n), n)
        out = self.rr_output(n)
        return {out: plus, -out: 1 - plus}

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
        """The reports from the signs ``r`` at the user's keys: randomised response of
        ``clip(sum_k r_k x_k)`` or the clipped sum plus Laplace noise (see the class)."""
        total = (r_held.astype(np.int64) * signs).sum(axis=1)
        eta = self.eta(n)
        if self.uses_randomised_response(n):
            # The sum is an integer in [-s, s]: one exact probability per possible value.
            plus = np.array(
                [
                    float(self.rr_plus_probability(max(-Fraction(eta), min(Fraction(eta), t)), n))
                    for t in map(Fraction, range(-self.s, self.s + 1))
                ]
            )
            out = self.rr_output(n)
            rr: NDArray[np.float64] = np.where(
                rng.random(total.shape[0]) < plus[total + self.s], out, -out
            )
            return rr
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
