"""Privacy loss distributions on a grid, and their convolution in extended precision.

A :class:`ComposedPLD` is the law of the privacy loss on the grid ``spacing`` with a mass at
``+inf`` and a bound on the 1-norm of its floating-point error; one batch's comes from
:mod:`aggregator.accountant.batch_pld`, and :mod:`aggregator.accountant.composition` composes
them with :func:`compose` (or, cached in parts, with :func:`convolve` and :func:`power`).

Extended-precision convolution with an error budget
---------------------------------------------------
Composed PLDs are computed here (dp_accounting's float64 FFT power understates ``delta``
by ~0.5% at ``delta = 1e-12``): repeated squaring and products of the per-batch arrays with
real FFTs in ``numpy.longdouble`` (64-bit significand on x86-64, ``u = 2^-64``), each array
carrying a bound ``e`` on the 1-norm of its error. For one convolution of computed ``a``
and ``b`` of length sum ``< N`` (``N`` the least power of two above it, no wrap-around), the
standard error model of the FFT (Higham, *Accuracy and Stability of Numerical Algorithms*,
Thm. 24.2: relative 2-norm error ``rho = log2(N) (mu + gamma_4 (sqrt 2 + mu))`` per
transform, twiddle factors accurate to ``mu ~ u``) gives
``||fl(a * b) - a * b||_2 <= (3 rho + 3u) max(|a|_1 |b|_2, |a|_2 |b|_1)``; twice that,
times ``sqrt(N)``, is added to the 1-norm budget, plus ``e_a |b|_1 + e_b |a|_1 + e_a e_b``
for the inputs' own errors. After each convolution, the ends holding little mass are
cut: the low end's mass moves up to the first entry kept, the high end's to the
infinity mass (both pessimistic: a larger loss never lowers ``delta``); together the cuts
of one composition move at most ``1e-7 delta``, and they also drop the rounding noise far
out in the tails, which would otherwise keep every array as long as the whole support. At the end
``delta(eps) <= computed delta(eps) + e`` (each loss's weight ``1 - e^(eps - l)`` is in
``[0, 1]``), and ``epsilon_total`` is the smallest ``eps`` at which
``computed delta(eps) + e <= delta`` was evaluated, found on the composed PLD exactly (a
closed form inside each grid interval, then checked). So the result is a certified upper
bound, with floating-point error accounted, not only "up to" it; it is never above basic
composition ``sum eps0``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "CUT",
    "UNIT_ROUNDOFF",
    "ComposedPLD",
    "LongArray",
    "compose",
    "convolve",
    "fft_size",
    "power",
]

LongArray = NDArray[np.longdouble]

CUT: Final = 2.0**-110
"""Least mass cut from each end of a composed array (moved pessimistically)."""
_SUM_SLACK: Final = 1e-12
"""Relative slack on a sum of up to 2^19 non-negative extended-precision terms."""
UNIT_ROUNDOFF: Final = float(np.finfo(np.longdouble).eps) / 2.0
"""Unit roundoff of the extended precision used (2^-64 on x86-64, 2^-53 where long
double is binary64: the budget then grows, the result stays certified)."""


@dataclass(frozen=True, slots=True)
class ComposedPLD:
    """A (composed) pessimistic PLD on the grid ``spacing``: ``probs[i]`` is the mass at the
    loss ``(lower + i) * spacing``, ``infinity`` the mass at ``+inf``, ``error`` a bound on
    the 1-norm of the floating-point error of ``probs``."""

    spacing: float
    lower: int
    probs: LongArray
    infinity: float
    error: float

    def _losses(self) -> LongArray:
        return (np.arange(self.probs.size) + self.lower) * np.longdouble(self.spacing)

    def _finite(self, epsilon: float, losses: LongArray) -> float:
        """``sum over losses > epsilon of (1 - e^(epsilon - l)) p_l``, rounded up."""
        above = losses > epsilon
        weights = -np.expm1(np.longdouble(epsilon) - losses[above])
        return float(np.dot(weights, self.probs[above])) * (1.0 + _SUM_SLACK)

    def delta_for_epsilon(self, epsilon: float) -> float:
        """A certified upper bound on ``delta(epsilon)`` of what this PLD dominates."""
        finite = self._finite(epsilon, self._losses())
        return min(1.0, finite + self.infinity + self.error)

    def epsilon_for_delta(self, delta: float) -> float:
        """The smallest ``eps >= 0`` at which :meth:`delta_for_epsilon` was evaluated and
        found ``<= delta`` (``inf`` if there is none): the grid point where the curve
        crosses ``delta`` by bisection, then the closed form inside the grid interval
        before it (``delta`` is ``U - e^eps V`` there), checked."""
        target = delta - self.infinity - self.error
        if target <= 0:
            return math.inf
        losses = self._losses()
        if self._finite(0.0, losses) <= target:
            return 0.0
        lo = max(0, 1 - self.lower)  # the first grid point above 0
        hi = self.probs.size - 1  # nothing lies above the last loss: delta there is 0
        if lo > hi:
            return math.inf  # unreachable: every loss <= 0 gives delta(0) = 0
        while lo < hi:  # the first k with finite delta at loss k <= target
            mid = (lo + hi) // 2
            if self._finite(float(losses[mid]), losses) <= target:
                hi = mid
            else:
                lo = mid + 1
        k = lo
        grid_point = float(losses[k])
        below = max(0.0, float(losses[k - 1])) if k >= 1 else 0.0
        tail = self.probs[k:]
        upper_mass = np.sum(tail)
        tilted = np.dot(tail, np.exp(losses[k] - losses[k:]))
        ratio = (upper_mass - np.longdouble(target)) / tilted if tilted > 0 else -1
        if ratio > 0:
            inside = float(losses[k] + np.log(ratio))
            candidate = max(below, inside) * (1.0 + 1e-12) + 1e-15
            if candidate < grid_point and self._finite(candidate, losses) <= target:
                return candidate
        return grid_point


def fft_size(n: int) -> int:
    """The least power of two ``>= n``: the error model (Higham, Thm. 24.2) is that of a
    radix-2 FFT of ``log2 N`` stages; mixed-radix sizes (3, 5, 7 factors) are outside it."""
    return 1 << max(0, n - 1).bit_length()


def convolve(a: ComposedPLD, b: ComposedPLD, cut: float) -> ComposedPLD:
    """``a * b`` with its error budget, ends holding at most ``cut`` moved (module
    docstring)."""
    length = a.probs.size + b.probs.size - 1
    size = fft_size(length)
    transform = np.fft.rfft(a.probs, n=size)
    # a squaring transforms its array once: the same bits as transforming it twice
    product = transform * (transform if b is a else np.fft.rfft(b.probs, n=size))
    probs = np.maximum(np.fft.irfft(product, n=size)[:length], np.longdouble(0))
    s_a, s_b = float(np.sum(a.probs)), float(np.sum(b.probs))
    r_a = float(np.sqrt(np.sum(a.probs * a.probs)))
    r_b = float(np.sqrt(np.sum(b.probs * b.probs)))
    rho = math.log2(size) * 7.1 * UNIT_ROUNDOFF
    rounding = 2.0 * (3.0 * rho + 3.0 * UNIT_ROUNDOFF) * max(s_a * r_b, r_a * s_b) * math.sqrt(size)
    error = a.error * s_b + b.error * s_a + a.error * b.error + rounding
    lower = a.lower + b.lower
    infinity = (a.infinity + b.infinity) * (1.0 + 4e-16)
    # cut the ends holding at most ``cut``: the low end up to the first entry kept, the high
    # end to +inf (also the floating-point noise far out in the tails, which would otherwise
    # keep every array as long as the whole support)
    low = int(np.searchsorted(np.cumsum(probs), cut, side="right"))
    high = probs.size - int(np.searchsorted(np.cumsum(probs[::-1]), cut, side="right"))
    if low >= high:  # everything is below the cut (cannot happen for a probability vector)
        low, high = 0, probs.size
    kept = probs[low:high].copy()
    kept[0] += np.sum(probs[:low])
    infinity += float(np.sum(probs[high:])) * (1.0 + 1e-15)
    return ComposedPLD(
        spacing=a.spacing, lower=lower + low, probs=kept, infinity=infinity, error=error
    )


def power(pld: ComposedPLD, count: int, cut: float) -> ComposedPLD:
    result: ComposedPLD | None = None
    base = pld
    while True:
        if count & 1:
            result = base if result is None else convolve(result, base, cut)
        count >>= 1
        if not count:
            break
        base = convolve(base, base, cut)
    assert result is not None
    return result


def compose(
    parts: Mapping[ComposedPLD, int] | Sequence[tuple[ComposedPLD, int]], *, cut: float = CUT
) -> ComposedPLD:
    """The composition of ``count`` copies of each PLD (all on one grid). After each
    convolution the ends holding at most ``cut`` are moved pessimistically (the high end to
    the infinity mass): :func:`epsilon_total_counts` takes ``1e-7 delta`` over all of them."""
    items = list(parts.items()) if isinstance(parts, Mapping) else list(parts)
    spacings = {pld.spacing for pld, _ in items}
    if len(spacings) != 1:
        raise ValueError(f"PLDs composed together must share one grid, got {sorted(spacings)}")
    total: ComposedPLD | None = None
    for pld, count in items:
        if count < 1:
            continue
        part = power(pld, count, cut)
        total = part if total is None else convolve(total, part, cut)
    if total is None:
        raise ValueError("nothing to compose")
    return total
