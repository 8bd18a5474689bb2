"""Upper bounds on the blanket engine's sum over the edges of its windows, one value each.

The engine of :mod:`aggregator.accountant.blanket` sums ``E[(N1 - tau)_+]``, ``tau =
tau0(K) + tau1 N0``, exactly over runs of constant threshold inside windows of ``K`` and
``N0`` holding all but ``1e-20`` of their mass (the rest is added as ``p`` times its mass).
The runs near the windows' edges carry almost nothing but cost as much as the others, so
only an *inner* window (all but :data:`INNER_TAIL` of the mass) is summed run by run; on
each *band* between the inner and the outer window a single value bounds the sum from
above:

    f(tau) = E(N1 - tau)_+ is non-increasing in tau, and tau is non-decreasing in N0,
    so sum_{N0 in band} Pr[N0] f(tau(N0)) <= Pr[N0 in band] f(tau(lowest N0 of the band)).

A row ``K`` inside the inner window has two bands (``N0`` below and above its inner
window); a row outside it is one band (its whole ``N0`` window). ``Pr[N0 in band]`` is a
difference of two of the engine's eps-independent cdf values (computed once per pair) and
``f`` at the band's lowest ``tau`` is the engine's run formula with ``k = floor(tau) + 1``
(a tangent of ``f`` at its own point, so equal to it), so each band carries the same error
budget as a run: ``3 rel'`` times its terms' magnitudes and ``2 eta S_(k-1)`` per unit of
probability for the rounding of ``tau`` (blanket module docstring). The result is an upper
bound whatever the windows; they only decide how close: a band's value exceeds its exact
sum by less than its mass times ``f``'s variation across the band, about ``1e-13`` of the
total here (measured in the tests against the sum over every run).
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import NDArray

from aggregator.accountant.tails import threshold_tails

__all__ = ["BAND_SLACK", "INNER_TAIL", "band_bounds", "slope_before"]

FloatArray = NDArray[np.float64]

INNER_TAIL: Final = 1e-13
"""Mass of each side of the inner windows, summed only as bands."""
BAND_SLACK: Final = 1e-12
"""The bands are used where their values exceed an estimate from below of their exact sum
by at most this fraction of the total; elsewhere (small batches, far in the curve's tail,
where the sum leans on the windows' edges) the outer window is summed run by run."""


def slope_before(
    k: FloatArray, ks: FloatArray, head: FloatArray, s_k: FloatArray, rel: float
) -> FloatArray:
    """An upper bound on ``S_(k-1) = Pr[Bin(K, 1/2) >= k - 1]`` from the group formula's
    ``head = (K/4) b(k - 1; K - 1, 1/2)`` and ``s_k = S_k``: ``b(k - 1; K, 1/2) = 2 head /
    (K - k + 1)`` for ``1 <= k <= K``; 1 for ``k <= 0``; ``2^-K`` for ``k = K + 1``. The
    factor covers the values' error budgets and the few roundings here."""
    inner = (k >= 1.0) & (k <= ks)
    denominator = np.where(inner, ks - k + 1.0, 1.0)
    value = np.where(inner, s_k + 2.0 * head / denominator, 0.0)
    value = np.where(k <= 0.0, 1.0, value)
    value = np.where(k > ks, np.ldexp(1.0, -ks.astype(np.int64)), value)
    return np.minimum(1.0, value * (1.0 + 4.0 * rel))


def band_bounds(  # noqa: PLR0917 (the engine's helper)
    tau0: FloatArray,
    tau1: float,
    bottom: FloatArray,
    top: FloatArray,
    ks: FloatArray,
    prob: FloatArray,
    prob_mag: FloatArray,
    eta: FloatArray,
    rel: float,
) -> tuple[FloatArray, FloatArray]:
    """``(upper, lower)`` for every row ``ks`` (in runs of consecutive rows) of the band
    ``N0`` in ``[bottom, top]``: ``upper = Pr[N0 in band] f(tau(bottom))`` plus its error
    budget, a certified bound (module docstring), and ``lower``, an estimate from below of
    the exact sum, ``Pr[N0 in band]`` times ``f(tau(bottom)) - (tau(top) - tau(bottom))
    S_k`` (``f`` is convex with slope ``-S_k`` at ``tau(bottom)``; for deciding whether the
    bands are tight enough, nothing certified). ``prob`` is the band's probability (a
    difference of cdf values, ``prob_mag`` the magnitude its error budget multiplies; both
    0 for an empty band), ``eta`` the rows' bound on the rounding of ``tau``."""
    tau = tau0 + tau1 * bottom
    k = np.clip(np.floor(tau) + 1.0, 0.0, ks + 1.0)
    ones = np.ones(ks.size, dtype=np.int64)
    head, s_k, rel_out = threshold_tails(k, ks, k, ones, np.arange(ks.size), rel)
    lin = (0.5 * ks - tau) * s_k
    value = np.maximum(prob * (head + lin), 0.0)
    err = 3.0 * rel_out * prob_mag * (head + np.abs(lin))
    run_prob = np.abs(prob) + 3.0 * rel_out * prob_mag
    err += 2.0 * eta * slope_before(k, ks, head, s_k, rel_out) * run_prob
    # f falls at slope S_k at most beyond tau, so f(tau(top)) >= f(tau) - tau1 (top -
    # bottom) S_k
    lower = prob * np.maximum(head + lin - tau1 * (top - bottom) * s_k, 0.0)
    return np.where(prob_mag > 0.0, value + err, 0.0), np.where(prob_mag > 0.0, lower, 0.0)
